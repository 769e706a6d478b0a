"""A2A with its official Python client (`a2a-sdk` 1.3.0), pinned, against tah: the card, a
streamed task (the task, its artifact, its completed status, each frame with tah's seq), the
same task read back and listed, and a second task in the same context. Run as a script; exit
non-zero on failure."""

import asyncio
import sys
import uuid

import httpx

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)

from tah_server import Tah


def user_message(text, context_id=None):
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])
    if context_id:
        message.context_id = context_id
    return message


async def main(tah):
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, tah.url + "/a2a/default").get_agent_card()
        assert card.name == "default", card
        assert [i.protocol_binding for i in card.supported_interfaces] == ["JSONRPC", "HTTP+JSON"]
        assert card.capabilities.streaming and card.capabilities.push_notifications

        for binding in ["JSONRPC", "HTTP+JSON"]:
            config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding])
            client = ClientFactory(config).create(card)

            events = []
            async for event in client.send_message(
                SendMessageRequest(message=user_message("think: what is in this workspace?"))
            ):
                events.append(event)
            kinds = [e.WhichOneof("payload") for e in events]
            assert kinds[0] == "task", kinds
            assert "artifact_update" in kinds, kinds
            assert kinds[-1] == "status_update", kinds
            assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
            seqs = [getattr(e, k).metadata["tah_seq"] for e, k in zip(events, kinds)]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
            task_id, context_id = events[0].task.id, events[0].task.context_id

            status, runs = tah.api("GET", f"/v1/sessions/{context_id}/runs")
            assert status == 200 and [r["id"] for r in runs["data"]] == [task_id], runs
            answer = events[-1].status_update.status.message.parts[0].text
            assert answer == runs["data"][0]["text"], (answer, runs)

            task = await client.get_task(GetTaskRequest(id=task_id, history_length=2))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert [m.role for m in task.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
            assert task.artifacts[0].parts[0].text == answer

            second = []
            async for event in client.send_message(
                SendMessageRequest(message=user_message("and now?", context_id))
            ):
                second.append(event)
            assert second[0].task.context_id == context_id
            listed = await client.list_tasks(ListTasksRequest(context_id=context_id))
            assert [t.id for t in listed.tasks] == [second[0].task.id, task_id], listed
            print(f"ok: {binding}: streamed {len(events)} frames, got, listed 2 tasks")


if __name__ == "__main__":
    server = Tah(mock_delay_ms=2)
    try:
        asyncio.run(main(server))
    except BaseException:
        print("".join(server.log)[-4000:], file=sys.stderr)
        raise
    finally:
        server.close()
