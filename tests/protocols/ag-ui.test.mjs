// AG-UI's own client (`@ag-ui/client`'s `HttpAgent`, which verifies every event it is sent),
// pinned, against tah: the conversation the agent object reconstructs must be tah's history,
// and its frontend tools and interrupts must be tah's client tools and approvals.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';

import { HttpAgent } from '@ag-ui/client';

import { agUiConversation, storedConversation, thinkingText } from './support/compare.mjs';
import { suiteServer } from './support/server.mjs';

const askUser = {
  name: 'ask_user',
  description: 'Ask the user a question',
  parameters: { type: 'object', properties: { question: { type: 'string' } }, required: ['question'] },
};

function agentOn(server, sessionId) {
  return new HttpAgent({ url: `${server.url}/v1/sessions/${sessionId}/ag-ui`, threadId: sessionId });
}

/** Runs the agent once, keeping every event it was sent. */
async function run(agent, params = {}) {
  const events = [];
  await agent.runAgent(params, { onEvent: ({ event }) => void events.push(event) });
  return events;
}

function say(agent, text) {
  agent.addMessage({ id: randomUUID(), role: 'user', content: text });
}

async function assertSameConversation(agent, server, sessionId) {
  assert.deepEqual(agUiConversation(agent.messages), storedConversation(await server.messages(sessionId)));
}

describe('@ag-ui/client HttpAgent against tah (mock model)', () => {
  const server = suiteServer();

  test('a turn streams text, reasoning, tool calls and results as tah records them', async () => {
    const sessionId = await server.createSession();
    const agent = agentOn(server, sessionId);
    say(agent, 'think: what is in this workspace?');
    const events = await run(agent);
    const types = events.map((e) => e.type);
    assert.equal(types[0], 'RUN_STARTED');
    assert.equal(types[1], 'MESSAGES_SNAPSHOT');
    assert.equal(types.at(-1), 'RUN_FINISHED');
    for (const t of ['REASONING_START', 'TEXT_MESSAGE_START', 'TOOL_CALL_START', 'TOOL_CALL_RESULT']) {
      assert.ok(types.includes(t), t);
    }
    assert.equal(events.at(-1).outcome.type, 'success');
    await assertSameConversation(agent, server, sessionId);
    const stored = await server.messages(sessionId);
    const reasoning = agent.messages.filter((m) => m.role === 'reasoning').map((m) => m.content);
    assert.deepEqual(reasoning, stored.map(thinkingText).filter((t) => t));
    const finished = events.at(-1);
    const runs = (await server.api('GET', `/v1/sessions/${sessionId}/runs`)).body.data;
    assert.equal(finished.result.run_id, runs.at(-1).id);
    assert.equal(finished.result.text, stored.at(-1).content);

    // The next run opens with a snapshot of tah's history, then the new turn.
    say(agent, 'and now?');
    await run(agent);
    await assertSameConversation(agent, server, sessionId);
  });

  test("the input's tools are the client's for that run, and the next run's tool message answers", async () => {
    const sessionId = await server.createSession();
    const agent = agentOn(server, sessionId);
    say(agent, 'ask the client what colour it likes');
    const events = await run(agent, { tools: [askUser] });
    const end = events.at(-1);
    assert.equal(end.type, 'RUN_FINISHED');
    const call = agent.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.function.name === 'ask_user');
    assert.ok(call, 'the model called the client tool');
    assert.deepEqual(end.outcome, { type: 'success', pendingToolCallIds: [call.id] });
    assert.deepEqual(JSON.parse(call.function.arguments), { question: 'ask the client what colour it likes' });
    const waiting = await server.session(sessionId);
    assert.equal(waiting.state, 'waiting_tool');
    const runs = (await server.api('GET', `/v1/sessions/${sessionId}/runs`)).body.data;
    assert.deepEqual(runs.at(-1).client_tools.map((t) => [t.name, t.input_schema]), [['ask_user', askUser.parameters]]);

    agent.addMessage({ id: randomUUID(), role: 'tool', toolCallId: call.id, content: 'green' });
    const next = await run(agent, { tools: [askUser] });
    assert.equal(next.at(-1).outcome.type, 'success');
    assert.match(next.at(-1).result.text, /ask_user answered: green/);
    await assertSameConversation(agent, server, sessionId);
    const finished = (await server.events(sessionId)).filter((e) => e.type === 'tool.finished' && e.data.call_id === call.id);
    assert.deepEqual(finished.map((e) => [e.data.output, e.data.is_error]), [['green', false]]);
  });

  test('an approval is an interrupt, and the resume of the next run answers it', async () => {
    const sessionId = await server.createSession();
    const agent = agentOn(server, sessionId);
    say(agent, 'write a note about interrupts');
    const events = await run(agent);
    assert.equal(events.at(-1).outcome.type, 'interrupt');
    assert.equal(agent.pendingInterrupts.length, 1);
    const [interrupt] = agent.pendingInterrupts;
    assert.equal(interrupt.reason, 'tool_call');
    const pending = (await server.api('GET', `/v1/sessions/${sessionId}/approvals`)).body.data;
    assert.deepEqual(pending.map((p) => p.call_id), [interrupt.toolCallId]);

    const next = await run(agent, {
      resume: [{ interruptId: interrupt.id, status: 'resolved', payload: { approved: true } }],
    });
    assert.equal(next.at(-1).outcome.type, 'success');
    assert.deepEqual(agent.pendingInterrupts, []);
    assert.ok(existsSync(join(server.workspace, 'notes.md')));
    await assertSameConversation(agent, server, sessionId);
    const resolved = (await server.events(sessionId)).filter((e) => e.type === 'tool.approval-resolved');
    assert.deepEqual(resolved.map((e) => [e.data.decision, e.data.by]), [['allow', 'user']]);
  });

  test('a client that comes back to a run waiting for an approval gets the same interrupt', async () => {
    const sessionId = await server.createSession();
    const agent = agentOn(server, sessionId);
    say(agent, 'write a note about coming back');
    const first = await run(agent);
    const interrupt = first.at(-1);
    assert.equal(interrupt.outcome.type, 'interrupt');

    // A reloaded page: a new agent on the thread, with no new message.
    const back = agentOn(server, sessionId);
    const events = await Promise.race([
      run(back),
      new Promise((_, reject) => setTimeout(() => reject(new Error('the reconnect never ended')), 10_000)),
    ]);
    assert.deepEqual(events.slice(0, 2).map((e) => e.type), ['RUN_STARTED', 'MESSAGES_SNAPSHOT']);
    assert.equal(events.at(-1).type, 'RUN_FINISHED');
    assert.deepEqual(events.at(-1).outcome, interrupt.outcome);
    assert.deepEqual(back.pendingInterrupts, agent.pendingInterrupts);
    await assertSameConversation(back, server, sessionId);

    // Its resume answers the interrupt.
    const [pending] = back.pendingInterrupts;
    const next = await run(back, { resume: [{ interruptId: pending.id, status: 'resolved', payload: { approved: true } }] });
    assert.equal(next.at(-1).outcome.type, 'success');
    assert.ok(existsSync(join(server.workspace, 'notes.md')));
  });

  test('a cancelled interrupt is a denial the model is told of', async () => {
    const sessionId = await server.createSession();
    const agent = agentOn(server, sessionId);
    say(agent, 'write a note nobody wants');
    await run(agent);
    const [interrupt] = agent.pendingInterrupts;
    await run(agent, { resume: [{ interruptId: interrupt.id, status: 'cancelled' }] });
    await assertSameConversation(agent, server, sessionId);
    const resolved = (await server.events(sessionId)).find((e) => e.type === 'tool.approval-resolved');
    assert.deepEqual([resolved.data.decision, resolved.data.by], ['deny', 'user']);
    const result = agent.messages.find((m) => m.role === 'tool' && m.toolCallId === interrupt.toolCallId);
    assert.match(result.content, /denied/);
  });

  test('sub-agents show as SUBAGENT events around their task call', async () => {
    const sessionId = await server.createSession();
    const agent = agentOn(server, sessionId);
    say(agent, 'delegate this');
    const events = await run(agent);
    const started = events.filter((e) => e.type === 'SUBAGENT_STARTED');
    const finished = events.filter((e) => e.type === 'SUBAGENT_FINISHED');
    const logged = (await server.events(sessionId)).filter((e) => e.type === 'subagent.started');
    assert.deepEqual(started.map((e) => [e.subagentRunId, e.parentToolCallId]), logged.map((e) => [e.data.session_id, e.data.call_id]));
    assert.deepEqual(finished.map((e) => e.subagentRunId), started.map((e) => e.subagentRunId));
    await assertSameConversation(agent, server, sessionId);
  });

  test('a client that connects with no messages gets the whole history in the snapshot', async () => {
    const sessionId = await server.createSession();
    const first = agentOn(server, sessionId);
    say(first, 'what is here?');
    await run(first);
    const fresh = agentOn(server, sessionId);
    const events = await run(fresh);
    assert.deepEqual(events.map((e) => e.type), ['RUN_STARTED', 'MESSAGES_SNAPSHOT', 'RUN_FINISHED']);
    await assertSameConversation(fresh, server, sessionId);
  });
});

describe('@ag-ui/client joining a run in progress', () => {
  const server = suiteServer({ mockDelayMs: 15 });

  test('a second client follows the rest of the run, and its next snapshot is the history', async () => {
    const sessionId = await server.createSession();
    const first = agentOn(server, sessionId);
    say(first, 'think: what is in this workspace?');
    const running = run(first);
    // Join while the answer streams.
    await server.waitForState(sessionId, 'running');
    const until = Date.now() + 10000;
    while (!(await server.events(sessionId)).some((e) => e.type === 'agent.assistant-stream')) {
      assert.ok(Date.now() < until, 'the answer streams');
      await new Promise((r) => setTimeout(r, 10));
    }
    const second = agentOn(server, sessionId);
    const events = await run(second);
    await running;
    assert.equal(events.at(-1).type, 'RUN_FINISHED');
    assert.equal(events.at(-1).result.text, (await server.messages(sessionId)).at(-1).content);
    await run(second);
    await assertSameConversation(second, server, sessionId);
    await assertSameConversation(first, server, sessionId);
  });
});

describe('@ag-ui/client against tah (fake OpenAI-compatible model)', () => {
  const server = suiteServer({ model: 'fake', pieces: 6 });

  test('a turn of a real provider client is the stored turn', async () => {
    const sessionId = await server.createSession();
    const agent = agentOn(server, sessionId);
    say(agent, 'list the files');
    await run(agent);
    await assertSameConversation(agent, server, sessionId);
  });
});

describe('bad AG-UI inputs get problem+json', () => {
  const server = suiteServer();

  test('each is a 4xx with a detail', async () => {
    const sessionId = await server.createSession();
    const path = `/v1/sessions/${sessionId}/ag-ui`;
    const base = { threadId: sessionId, runId: 'r', messages: [{ id: 'u', role: 'user', content: 'hi' }], tools: [], context: [], state: {} };
    const cases = [
      ['{', 400],
      [JSON.stringify({ ...base, threadId: undefined }), 422],
      [JSON.stringify({ ...base, runId: '' }), 400],
      [JSON.stringify({ ...base, messages: {} }), 422],
      [JSON.stringify({ ...base, messages: [{ id: 'x', role: 'wizard', content: 'hi' }] }), 422],
      [JSON.stringify({ ...base, messages: [{ id: 'x', role: 'user', content: [{ type: 'image', source: { type: 'url', value: 'http://x' } }] }] }), 422],
      [JSON.stringify({ ...base, messages: [{ id: 'x', role: 'user', content: '  ' }] }), 400],
      [JSON.stringify({ ...base, tools: [{ name: 'read_file', description: 'clash' }] }), 400],
      [JSON.stringify({ ...base, tools: [{ name: 'bad name!', description: '' }] }), 400],
      [JSON.stringify({ ...base, resume: [{ interruptId: 'x', status: 'maybe' }] }), 422],
    ];
    for (const [body, status] of cases) {
      const response = await fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      assert.equal(response.status, status, `${body} → ${response.status}`);
      assert.equal(response.headers.get('content-type'), 'application/problem+json');
      assert.ok((await response.json()).detail);
    }
    // An approval waits: a new message is refused, and a resume must carry a decision.
    const agent = agentOn(server, sessionId);
    say(agent, 'write a note');
    await run(agent);
    const [interrupt] = agent.pendingInterrupts;
    const refused = await fetch(server.url + path, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...base, messages: [{ id: 'u2', role: 'user', content: 'something else' }] }),
    });
    assert.equal(refused.status, 409);
    const undecided = await fetch(server.url + path, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...base, messages: [], resume: [{ interruptId: interrupt.id, status: 'resolved', payload: {} }] }),
    });
    assert.equal(undecided.status, 422);
    const missing = await fetch(`${server.url}/v1/sessions/${'0'.repeat(8)}-0000-7000-8000-${'0'.repeat(12)}/ag-ui`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(base),
    });
    assert.equal(missing.status, 404);
  });
});
