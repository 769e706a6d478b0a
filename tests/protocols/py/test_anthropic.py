"""Anthropic's Python SDK (`anthropic`, pinned), `client.beta.*`, against tah's `/anthropic`
face: an agent, the local environment, a session, a streamed turn whose agent.message is tah's
own record, the event list, and typed errors. Run as a script: exits non-zero on failure."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import anthropic  # noqa: E402

from tah_server import Tah  # noqa: E402

OPERATOR = "anthropic-face-operator-token"


def main():
    with Tah(extra_args=["--api-token", OPERATOR], mock_delay_ms=5) as server:
        status, made = server.api("POST", "/v1/keys", {"tenant": "acme", "role": "admin"},
                                  token=OPERATOR)
        assert status == 201, (status, made)
        key = made["key"]
        client = anthropic.Anthropic(base_url=server.url + "/anthropic", api_key=key,
                                     max_retries=0)

        agent = client.beta.agents.create(name="helper", model="mock", system="Be brief.")
        assert agent.version == 1 and agent.model.id == "mock", agent
        updated = client.beta.agents.update(agent.id, version=1, description="v2")
        assert updated.version == 2, updated
        versions = [v.version for v in client.beta.agents.versions.list(agent.id)]
        assert versions == [2, 1], versions

        environment = client.beta.environments.create(name="py", config={"type": "cloud"})
        assert environment.id == "env_local", environment

        session = client.beta.sessions.create(agent=agent.id, environment_id=environment.id,
                                              title="from python")
        assert session.status == "idle" and session.agent.version == 2, session

        seen = []
        with client.beta.sessions.events.stream(session.id) as stream:
            client.beta.sessions.events.send(session.id, events=[
                {"type": "user.message", "content": [{"type": "text", "text": "Hello from Python"}]},
            ])
            for event in stream:
                seen.append(event)
                if event.type == "session.status_idle":
                    break
        assert seen[-1].stop_reason.type == "end_turn", seen[-1]
        texts = ["".join(b.text for b in e.content) for e in seen if e.type == "agent.message"]
        status, messages = server.api("GET", f"/v1/sessions/{session.id}/messages?limit=500",
                                      token=key)
        assert status == 200
        record = [m["content"] for m in messages["data"] if m["role"] == "assistant" and m["content"]]
        assert texts == record, (texts, record)

        listed = [e.id for e in client.beta.sessions.events.list(session.id, limit=4)]
        assert listed == [e.id for e in seen], (listed, [e.id for e in seen])

        ids = [s.id for s in client.beta.sessions.list()]
        assert session.id in ids, ids

        try:
            client.beta.sessions.retrieve("0190c0de-0000-7000-8000-000000000000")
            raise AssertionError("an unknown session was found")
        except anthropic.NotFoundError:
            pass
        try:
            client.beta.sessions.create(agent=agent.id, environment_id="env_local",
                                        resources=[{"type": "file", "file_id": "f"}])
            raise AssertionError("resources were taken")
        except anthropic.BadRequestError as error:
            assert "resources" in str(error), error
        bad = anthropic.Anthropic(base_url=server.url + "/anthropic", api_key="tah_wrong",
                                  max_retries=0)
        try:
            bad.beta.sessions.list()
            raise AssertionError("a wrong key was taken")
        except anthropic.AuthenticationError:
            pass
    print("test_anthropic.py: ok")


if __name__ == "__main__":
    main()
