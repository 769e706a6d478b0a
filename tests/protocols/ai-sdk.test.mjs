// The Vercel AI SDK's own client (`AbstractChat` with `DefaultChatTransport`, and
// `readUIMessageStream`), pinned, against tah: what the SDK reconstructs from tah's UI message
// stream must be tah's record of the run. Every test runs with the current major (ai 7) and
// the previous one (ai 6), which many apps still pin.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { describe, test } from 'node:test';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

import * as ai7 from 'ai';
import * as ai6 from 'ai6';

import { assertUiMessageIsTurn } from './support/compare.mjs';
import { lastTurn, startTah, suiteServer, until } from './support/server.mjs';

const require = createRequire(import.meta.url);
const versions = [
  [`ai@${require('ai/package.json').version}`, ai7],
  [`ai@${require('ai6/package.json').version}`, ai6],
];

/** A headless chat: the SDK's `AbstractChat` with the plainest state, opened on `messages`. */
function chatOn(ai, server, sessionId, { messages = [], ...options } = {}) {
  const state = {
    status: 'ready',
    error: undefined,
    messages,
    pushMessage(m) {
      this.messages = [...this.messages, m];
    },
    popMessage() {
      this.messages = this.messages.slice(0, -1);
    },
    replaceMessage(i, m) {
      this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)];
    },
    snapshot: (thing) => structuredClone(thing),
  };
  class HeadlessChat extends ai.AbstractChat {}
  const errors = [];
  const chat = new HeadlessChat({
    id: sessionId,
    state,
    transport: new ai.DefaultChatTransport({ api: `${server.url}/v1/sessions/${sessionId}/ai-sdk/chat` }),
    onError: (e) => errors.push(e),
    ...options,
  });
  chat.errors = errors;
  return chat;
}

const last = (chat) => chat.messages[chat.messages.length - 1];
const toolPart = (message, id) => message.parts.find((p) => p.toolCallId === id);

/** The session's history as UI messages (GET …/ai-sdk/messages). */
async function history(server, sessionId) {
  const response = await fetch(`${server.url}/v1/sessions/${sessionId}/ai-sdk/messages`);
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type'), /^application\/json/);
  return response.json();
}

/**
 * Messages as plain JSON (what a client keeps of them). AI SDK 6 gives reasoning parts no id:
 * with `reasoningIds: false` they are compared without it.
 */
function plain(messages, { reasoningIds = true } = {}) {
  const copy = JSON.parse(JSON.stringify(messages));
  if (!reasoningIds) for (const m of copy) for (const p of m.parts) if (p.type === 'reasoning') delete p.id;
  return copy;
}

for (const [version, ai] of versions) {
  describe(`${version} against tah (mock model)`, () => {
    const server = suiteServer();

    test('a turn with tool calls and reasoning is one assistant message', async () => {
      const sessionId = await server.createSession();
      const chat = chatOn(ai, server, sessionId);
      await chat.sendMessage({ text: 'think: what is in this workspace?' });
      assert.equal(chat.status, 'ready');
      assert.deepEqual(chat.errors, []);
      assert.equal(chat.messages.length, 2);
      const stored = await server.messages(sessionId);
      const message = last(chat);
      assertUiMessageIsTurn(message, lastTurn(stored));
      assert.equal(message.id, (await server.session(sessionId)).last_run_id);
      assert.ok(message.parts.some((p) => p.type === 'reasoning'), 'the mock thinks when asked to');
      // A second turn continues the same session: its history is tah's, not the client's.
      await chat.sendMessage({ text: 'and now?' });
      assertUiMessageIsTurn(last(chat), lastTurn(await server.messages(sessionId)));
      const users = (await server.messages(sessionId)).filter((m) => m.role === 'user');
      assert.deepEqual(users.map((m) => m.content), ['think: what is in this workspace?', 'and now?']);
    });

    test('an approval asked by the policy is answered through the SDK and the run goes on', async () => {
      const sessionId = await server.createSession();
      const chat = chatOn(ai, server, sessionId, {
        sendAutomaticallyWhen: ai.lastAssistantMessageIsCompleteWithApprovalResponses,
      });
      await chat.sendMessage({ text: 'write a note about approvals' });
      const asked = last(chat).parts.find((p) => p.type === 'tool-write_file');
      assert.equal(asked.state, 'approval-requested');
      assert.equal(asked.approval.id, asked.toolCallId);
      assert.equal((await server.session(sessionId)).state, 'waiting_tool');
      const pending = (await server.api('GET', `/v1/sessions/${sessionId}/approvals`)).body.data;
      assert.deepEqual(pending.map((p) => p.call_id), [asked.toolCallId]);

      await chat.addToolApprovalResponse({ id: asked.approval.id, approved: true });
      await until(() => chat.status === 'ready' && toolPart(last(chat), asked.toolCallId).state === 'output-available', 'the rest of the run');
      await server.waitForState(sessionId, 'completed');
      assert.deepEqual(chat.errors, []);
      assert.equal(chat.messages.length, 2, 'the approval continues the same assistant message');
      assertUiMessageIsTurn(last(chat), lastTurn(await server.messages(sessionId)));
      assert.ok(existsSync(join(server.workspace, 'notes.md')));
      const resolved = (await server.events(sessionId)).filter((e) => e.type === 'tool.approval-resolved');
      assert.deepEqual(resolved.map((e) => [e.data.call_id, e.data.decision, e.data.by]), [[asked.toolCallId, 'allow', 'user']]);
    });

    test('a denial is an output-denied part, and the model is told', async () => {
      const sessionId = await server.createSession();
      const chat = chatOn(ai, server, sessionId, {
        sendAutomaticallyWhen: ai.lastAssistantMessageIsCompleteWithApprovalResponses,
      });
      await chat.sendMessage({ text: 'write a note that must not be written' });
      const asked = last(chat).parts.find((p) => p.state === 'approval-requested');
      await chat.addToolApprovalResponse({ id: asked.approval.id, approved: false, reason: 'not today' });
      await until(() => chat.status === 'ready' && toolPart(last(chat), asked.toolCallId).state === 'output-denied', 'the denial');
      await server.waitForState(sessionId, 'completed');
      assertUiMessageIsTurn(last(chat), lastTurn(await server.messages(sessionId)), { denied: [asked.toolCallId] });
      const resolved = (await server.events(sessionId)).find((e) => e.type === 'tool.approval-resolved');
      assert.deepEqual([resolved.data.decision, resolved.data.by, resolved.data.reason], ['deny', 'user', 'not today']);
    });

    test("the client's own tools are run by the SDK and their outputs go back", async () => {
      const sessionId = await server.createSession({
        client_tools: [{ name: 'ask_user', description: 'Ask the user', input_schema: { type: 'object', properties: { question: { type: 'string' } } } }],
      });
      const chat = chatOn(ai, server, sessionId, {
        sendAutomaticallyWhen: ai.lastAssistantMessageIsCompleteWithToolCalls,
        onToolCall: ({ toolCall }) => {
          // Not awaited, as the SDK asks of onToolCall.
          chat.addToolOutput({ tool: toolCall.toolName, toolCallId: toolCall.toolCallId, output: { colour: 'blue' } });
        },
      });
      await chat.sendMessage({ text: 'ask the client for a colour' });
      await until(() => chat.status === 'ready' && last(chat).parts.some((p) => p.type === 'text'), 'the answer');
      await server.waitForState(sessionId, 'completed');
      assertUiMessageIsTurn(last(chat), lastTurn(await server.messages(sessionId)));
      assert.match(last(chat).parts.find((p) => p.type === 'text').text, /ask_user answered: \{"colour":"blue"\}/);
      // The part keeps the output the client gave it.
      assert.deepEqual(last(chat).parts.find((p) => p.type === 'tool-ask_user').output, { colour: 'blue' });
    });

    test('a stream reconnects to the active run and rebuilds the same message', async () => {
      const slow = await startTah({ mockDelayMs: 15 });
      try {
        const sessionId = await slow.createSession();
        const first = chatOn(ai, slow, sessionId);
        const sent = first.sendMessage({ text: 'what is in this workspace?' });
        await slow.waitForState(sessionId, ['running', 'waiting_tool']);
        // Another tab: the SDK's resume (GET …/ai-sdk/chat/{chat id}/stream) replays the run.
        const second = chatOn(ai, slow, sessionId);
        await second.resumeStream();
        await sent;
        assert.deepEqual(second.errors, []);
        assert.equal(second.messages.length, 1);
        assert.deepEqual(second.messages[0], first.messages[1]);
        assertUiMessageIsTurn(second.messages[0], lastTurn(await slow.messages(sessionId)));
        // Nothing runs now: nothing to resume (204).
        const none = await fetch(`${slow.url}/v1/sessions/${sessionId}/ai-sdk/chat/stream`);
        assert.equal(none.status, 204);
      } finally {
        await slow.close();
      }
    });

    test('the history is the chat as it was shown, under the same ids, and valid UI messages', async () => {
      const sessionId = await server.createSession();
      const chat = chatOn(ai, server, sessionId, {
        sendAutomaticallyWhen: ai.lastAssistantMessageIsCompleteWithApprovalResponses,
      });
      await chat.sendMessage({ text: 'think: what is in this workspace?' });
      for (const [text, approved] of [['write a note about approvals', true], ['write a note that must not be written', false]]) {
        await chat.sendMessage({ text });
        const asked = last(chat).parts.find((p) => p.state === 'approval-requested');
        await chat.addToolApprovalResponse({ id: asked.approval.id, approved, reason: approved ? undefined : 'not today' });
        const final = approved ? 'output-available' : 'output-denied';
        await until(() => chat.status === 'ready' && toolPart(last(chat), asked.toolCallId).state === final, text);
        await server.waitForState(sessionId, 'completed');
      }
      assert.deepEqual(chat.errors, []);

      const messages = await history(server, sessionId);
      assert.deepEqual(await history(server, sessionId), messages, 'the same on every call');
      assert.deepEqual(plain(await ai.validateUIMessages({ messages })), messages, "the SDK's own validation");
      assert.deepEqual(messages.map((m) => m.role), chat.messages.map((m) => m.role));
      const reasoningIds = version.startsWith('ai@7');
      for (const [i, shown] of plain(chat.messages, { reasoningIds }).entries()) {
        const kept = plain([messages[i]], { reasoningIds })[0];
        if (shown.role === 'user') {
          // The client names its own messages; the server's names are its own, and stable.
          assert.deepEqual(kept.parts, shown.parts);
          assert.match(kept.id, /^user-\d+$/);
        } else {
          // What the stream left in the chat, approvals answered as the SDK keeps them.
          assert.deepEqual(kept, shown);
        }
      }
      const states = messages.flatMap((m) => m.parts).filter((p) => p.type.startsWith('tool-')).map((p) => p.state);
      assert.ok(states.every((s) => ['output-available', 'output-error', 'output-denied'].includes(s)), states.join(' '));
      assert.ok(states.includes('output-denied'));
      console.log(`history: ${messages.length} messages, ${states.length} tool parts, ${JSON.stringify(messages).length} bytes`);
    });

    test('a chat opened on the history resumes the run in progress into the same message', async () => {
      const slow = await startTah({ mockDelayMs: 30 });
      try {
        const sessionId = await slow.createSession();
        const first = chatOn(ai, slow, sessionId);
        await first.sendMessage({ text: 'what is in this workspace?' });
        const sent = first.sendMessage({ text: 'and what is in it now?' });
        await slow.waitForState(sessionId, ['running', 'waiting_tool']);
        // A reload: the history has the run as far as it got, under the run's id.
        const messages = await history(slow, sessionId);
        const runId = (await slow.session(sessionId)).last_run_id;
        assert.equal(messages.length, 4);
        assert.equal(messages[3].id, runId);
        await ai.validateUIMessages({ messages });
        const reopened = chatOn(ai, slow, sessionId, { messages });
        await reopened.resumeStream();
        await sent;
        assert.deepEqual(reopened.errors, []);
        // The replay took the message's place: nothing shows twice.
        assert.equal(reopened.messages.length, 4);
        assert.deepEqual(reopened.messages.map((m) => m.id), messages.map((m) => m.id));
        assert.deepEqual(plain([last(reopened)]), plain([last(first)]));
        assert.deepEqual(plain(await history(slow, sessionId)).slice(1), plain(reopened.messages).slice(1));
        console.log(`in progress: ${messages[3].parts.length} of ${last(first).parts.length} parts in the history`);
      } finally {
        await slow.close();
      }
    });

    test('readUIMessageStream reads a raw stream into the same message', async () => {
      const sessionId = await server.createSession();
      const transport = new ai.DefaultChatTransport({ api: `${server.url}/v1/sessions/${sessionId}/ai-sdk/chat` });
      const stream = await transport.sendMessages({
        chatId: sessionId,
        trigger: 'submit-message',
        messageId: undefined,
        messages: [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: 'hello' }] }],
        abortSignal: undefined,
      });
      let message;
      for await (const m of ai.readUIMessageStream({ stream })) message = m;
      assertUiMessageIsTurn(message, lastTurn(await server.messages(sessionId)));
    });
  });
}

describe('ai against tah (fake OpenAI-compatible model)', () => {
  const server = suiteServer({ model: 'fake', pieces: 7 });

  test('a turn streamed by a real provider client is the stored turn', async () => {
    const sessionId = await server.createSession();
    const chat = chatOn(ai7, server, sessionId);
    await chat.sendMessage({ text: 'list the files' });
    assert.deepEqual(chat.errors, []);
    const turn = lastTurn(await server.messages(sessionId));
    assertUiMessageIsTurn(last(chat), turn);
    assert.equal(last(chat).parts.filter((p) => p.type === 'tool-list_files').length, 1);
  });
});

describe('bad requests get problem+json', () => {
  const server = suiteServer();

  test('each is a 4xx with a detail', async () => {
    const sessionId = await server.createSession();
    const chat = `/v1/sessions/${sessionId}/ai-sdk/chat`;
    const user = { id: 'u', role: 'user', parts: [{ type: 'text', text: 'hi' }] };
    const cases = [
      [chat, '{not json', 400],
      [chat, JSON.stringify([user]), 422],
      [chat, JSON.stringify({ id: 'c', messages: [] }), 400],
      [chat, JSON.stringify({ id: 'c', messages: 'hi' }), 422],
      [chat, JSON.stringify({ id: 'c', messages: [{ id: 'u', role: 'robot', parts: [] }] }), 422],
      [chat, JSON.stringify({ id: 'c', messages: [user], trigger: 'regenerate-message', messageId: 'x' }), 422],
      [chat, JSON.stringify({ id: 'c', messages: [user], trigger: 'sideways' }), 400],
      [chat, JSON.stringify({ id: 'c', messages: [{ ...user, parts: [{ type: 'file', url: 'data:,', mediaType: 'text/plain' }] }] }), 422],
      [chat, JSON.stringify({ id: 'c', messages: [{ ...user, parts: [] }] }), 400],
      [chat, JSON.stringify({ id: 'c', messages: [{ id: 'a', role: 'assistant', parts: [] }] }), 409],
      [`/v1/sessions/${'0'.repeat(8)}-0000-7000-8000-${'0'.repeat(12)}/ai-sdk/chat`, JSON.stringify({ id: 'c', messages: [user] }), 404],
      ['/v1/sessions/not-a-uuid/ai-sdk/chat', JSON.stringify({ id: 'c', messages: [user] }), 404],
    ];
    for (const [path, body, status] of cases) {
      const response = await fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      assert.equal(response.status, status, `${body} → ${response.status}`);
      assert.equal(response.headers.get('content-type'), 'application/problem+json');
      assert.ok((await response.json()).detail);
    }
    const wrongType = await fetch(server.url + chat, { method: 'POST', headers: { 'content-type': 'text/plain' }, body: '{}' });
    assert.equal(wrongType.status, 415);
    for (const [path, status] of [
      [`/v1/sessions/${sessionId}/ai-sdk/messages?after=3`, 400],
      [`/v1/sessions/${'0'.repeat(8)}-0000-7000-8000-${'0'.repeat(12)}/ai-sdk/messages`, 404],
    ]) {
      const response = await fetch(server.url + path);
      assert.equal(response.status, status, path);
      assert.equal(response.headers.get('content-type'), 'application/problem+json');
    }
    const strict = await fetch(`${server.url}/v1/sessions/${sessionId}/ai-sdk/chat/stream?after=3`);
    assert.equal(strict.status, 400);
    assert.equal(strict.headers.get('content-type'), 'application/problem+json');
    const unknown = await fetch(`${server.url}/v1/sessions/${'0'.repeat(8)}-0000-7000-8000-${'0'.repeat(12)}/ai-sdk/chat/stream`);
    assert.equal(unknown.status, 404);
    assert.equal(unknown.headers.get('content-type'), 'application/problem+json');
  });
});

