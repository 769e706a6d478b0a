"""The `openai` Python package (pinned) against tah's OpenAI face under /openai/v1: a streamed
response, a function tool answered in the next response, an error typed by the SDK, and an
Agents API session whose turn streams to idle. Run as a script; exit non-zero on failure."""

import sys
import time

import openai
from openai import OpenAI

from tah_server import Tah

ASK_USER = {
    "type": "function",
    "name": "ask_user",
    "description": "Ask the user a question",
    "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
}


def main():
    with Tah(extra_args=["--api-token", "python-openai-operator"]) as tah:
        client = OpenAI(base_url=tah.url + "/openai/v1", api_key="python-openai-operator", max_retries=0)

        # A streamed response, as the SDK's helper accumulates it.
        with client.responses.stream(model="mock", input="hello from python") as stream:
            events = list(stream)
            final = stream.get_final_response()
        types = [e.type for e in events]
        assert types[0] == "response.created" and types[-1] == "response.completed", types
        numbers = [e.sequence_number for e in events]
        assert numbers == sorted(set(numbers)), numbers
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert final.output_text == deltas and "hello from python" in deltas, final.output_text
        assert client.responses.retrieve(final.id).output_text == final.output_text

        # A function tool round trip.
        first = client.responses.create(input="ask the client about it", tools=[ASK_USER])
        call = next(item for item in first.output if item.type == "function_call")
        second = client.responses.create(
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "yes"}],
        )
        assert second.status == "completed" and "yes" in second.output_text, second.output_text

        # Errors as the SDK types them.
        try:
            client.responses.create(input="x", temperature=0.5)
            raise AssertionError("temperature was accepted")
        except openai.BadRequestError as error:
            assert "temperature" in str(error), error
        try:
            client.responses.retrieve("resp_unknown")
            raise AssertionError("an unknown response was found")
        except openai.NotFoundError:
            pass

        # An Agents API session: a turn streams to idle.
        session = client.beta.agents.sessions.create(environment={"type": "none"})
        stream = client.beta.agents.sessions.events.stream(session.id)
        client.beta.agents.sessions.events.create(session.id, events=[{
            "type": "agent.session.input.message",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi agents"}]}],
        }])
        seen = []
        deadline = time.time() + 20
        for event in stream:
            seen.append(event.type)
            if event.type == "agent.session.idle" or time.time() > deadline:
                break
        stream.close()
        assert "agent.session.turn.completed" in seen and seen[-1] == "agent.session.idle", seen
        items = client.beta.agents.sessions.items.list(session.id)
        assert items.data[-1].role == "assistant", items.data
    print("ok: openai (Python) against tah's OpenAI face")


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # noqa: BLE001 - the script reports any failure
        print(f"FAILED: {error!r}", file=sys.stderr)
        raise
