// OpenAI's own client (`openai`, pinned) against tah's OpenAI face under `/openai/v1`:
// Responses (plain, streamed, background and resumed, function tools, chains, conversations,
// approvals, cancel, delete, input items), the typed errors of its SDK, and tenants.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import OpenAI from 'openai';

import { suiteServer, until } from './support/server.mjs';

const OPERATOR = 'openai-face-operator';

const askUser = {
  type: 'function',
  name: 'ask_user',
  description: 'Ask the user a question',
  parameters: { type: 'object', properties: { question: { type: 'string' } }, required: ['question'] },
};

function clientOf(server, apiKey = OPERATOR) {
  return new OpenAI({ baseURL: `${server.url}/openai/v1`, apiKey, maxRetries: 0 });
}

/** tah's own API with the operator's token. */
async function tah(server, method, path, body) {
  const response = await fetch(server.url + path, {
    method,
    headers: {
      authorization: `Bearer ${OPERATOR}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : null };
}

async function keyFor(server, tenant, role = 'member') {
  const { status, body } = await tah(server, 'POST', '/v1/keys', { tenant, role, name: `${tenant}-${role}` });
  assert.equal(status, 201, JSON.stringify(body));
  return body.key;
}

async function collect(stream) {
  const events = [];
  for await (const event of stream) events.push(event);
  return events;
}

/** The tah session a response's conversation is. */
function sessionOf(response) {
  const hex = response.conversation.id.replace('conv_', '');
  return [hex.slice(0, 8), hex.slice(8, 12), hex.slice(12, 16), hex.slice(16, 20), hex.slice(20)].join('-');
}

/** The user messages tah keeps for a session. */
async function userTexts(server, sessionId) {
  const { body } = await tah(server, 'GET', `/v1/sessions/${sessionId}/messages?limit=500`);
  return body.data.filter((m) => m.role === 'user').map((m) => m.content);
}

function assertIncreasing(events) {
  const numbers = events.map((e) => e.sequence_number);
  for (let i = 1; i < numbers.length; i++) assert.ok(numbers[i - 1] < numbers[i], `${numbers}`);
}

describe('openai Responses against tah (mock model)', () => {
  const server = suiteServer({ extraArgs: ['--api-token', OPERATOR] });

  test('a plain response: the default agent answers, tah keeps it as a session', async () => {
    const client = clientOf(server);
    const response = await client.responses.create({
      model: 'mock',
      input: 'hello there',
      instructions: 'Answer briefly.',
      metadata: { purpose: 'test' },
    });
    assert.equal(response.object, 'response');
    assert.equal(response.status, 'completed');
    assert.match(response.output_text, /hello there/);
    assert.equal(response.instructions, 'Answer briefly.');
    assert.deepEqual(response.metadata, { purpose: 'test' });
    assert.ok(response.usage.total_tokens >= 0);
    const types = response.output.map((item) => item.type);
    assert.ok(types.includes('mcp_call'), `${types}`); // the mock lists the workspace
    assert.equal(types.at(-1), 'message');
    const again = await client.responses.retrieve(response.id);
    assert.deepEqual(again.output, response.output);
    const { body: session } = await tah(server, 'GET', `/v1/sessions/${sessionOf(response)}`);
    assert.equal(session.state, 'completed');
    assert.deepEqual(session.metadata, { purpose: 'test' });
  });

  test('a streamed response: the helper accumulates the same response as tah keeps', async () => {
    const client = clientOf(server);
    const stream = client.responses.stream({ input: 'stream please' });
    const events = await collect(stream);
    const final = await stream.finalResponse();
    assert.equal(events[0].type, 'response.created');
    assert.equal(events[1].type, 'response.in_progress');
    assert.equal(events.at(-1).type, 'response.completed');
    assertIncreasing(events);
    const kinds = new Set(events.map((e) => e.type));
    for (const kind of [
      'response.output_item.added', 'response.output_item.done', 'response.content_part.added',
      'response.content_part.done', 'response.output_text.delta', 'response.output_text.done',
    ]) assert.ok(kinds.has(kind), kind);
    const deltas = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
    assert.equal(final.output_text, deltas);
    const stored = await client.responses.retrieve(final.id);
    assert.equal(stored.output_text, final.output_text);
    assert.equal(stored.status, 'completed');
  });

  test('previous_response_id and conversation continue the same session', async () => {
    const client = clientOf(server);
    const first = await client.responses.create({ input: 'first message' });
    const second = await client.responses.create({ input: 'second message', previous_response_id: first.id });
    assert.equal(second.conversation.id, first.conversation.id);
    assert.equal(second.previous_response_id, first.id);
    assert.match(second.output_text, /second message/);
    const third = await client.responses.create({ input: 'third message', conversation: first.conversation.id });
    assert.match(third.output_text, /third message/);
    assert.equal(third.conversation.id, first.conversation.id);
    assert.deepEqual(await userTexts(server, sessionOf(first)), ['first message', 'second message', 'third message']);
    // An older response no longer continues: the conversation is one line.
    await assert.rejects(
      client.responses.create({ input: 'branch', previous_response_id: first.id }),
      (e) => e instanceof OpenAI.BadRequestError && /latest response/.test(e.message),
    );
    const items = await client.responses.inputItems.list(third.id);
    assert.deepEqual(items.data.map((i) => i.content[0].text), ['third message']);
  });

  test('a function tool round trip: function_call out, function_call_output in', async () => {
    const client = clientOf(server);
    const stream = client.responses.stream({ input: 'ask the client what to do', tools: [askUser] });
    const events = await collect(stream);
    const first = await stream.finalResponse();
    assert.equal(first.status, 'completed');
    const call = first.output.find((item) => item.type === 'function_call');
    assert.ok(call, JSON.stringify(first.output));
    assert.equal(call.name, 'ask_user');
    assert.deepEqual(JSON.parse(call.arguments), { question: 'ask the client what to do' });
    const argsDone = events.find((e) => e.type === 'response.function_call_arguments.done');
    assert.equal(argsDone.arguments, call.arguments);
    assert.deepEqual(first.tools.map((t) => t.name), ['ask_user']);
    const second = await client.responses.create({
      previous_response_id: first.id,
      input: [{ type: 'function_call_output', call_id: call.call_id, output: 'paint it blue' }],
    });
    assert.notEqual(second.id, first.id);
    assert.equal(second.status, 'completed');
    assert.match(second.output_text, /paint it blue/);
    const items = await client.responses.inputItems.list(second.id);
    assert.deepEqual(items.data.map((i) => [i.type, i.call_id, i.output]), [
      ['function_call_output', call.call_id, 'paint it blue'],
    ]);
    // The first response is still what it was.
    const again = await client.responses.retrieve(first.id);
    assert.deepEqual(again.output, first.output.map(({ parsed_arguments, ...item }) => item));
  });

  test('an approval: mcp_approval_request out, mcp_approval_response in, then the mcp_call', async () => {
    const client = clientOf(server);
    const first = await client.responses.create({ input: 'write a note about approvals' });
    const request = first.output.find((item) => item.type === 'mcp_approval_request');
    assert.ok(request, JSON.stringify(first.output));
    assert.equal(request.server_label, 'tah');
    assert.equal(request.name, 'write_file');
    const stream = client.responses.stream({
      previous_response_id: first.id,
      input: [{ type: 'mcp_approval_response', approval_request_id: request.id, approve: true }],
    });
    const events = await collect(stream);
    const second = await stream.finalResponse();
    assertIncreasing(events);
    const call = second.output.find((item) => item.type === 'mcp_call');
    assert.equal(call.name, 'write_file');
    assert.equal(call.approval_request_id, request.id);
    assert.equal(call.status, 'completed');
    assert.equal(second.status, 'completed');
    const items = await client.responses.inputItems.list(second.id);
    assert.deepEqual(items.data.map((i) => [i.type, i.approve]), [['mcp_approval_response', true]]);
    // Answering again: nothing waits any more.
    await assert.rejects(
      client.responses.create({
        previous_response_id: second.id,
        input: [{ type: 'mcp_approval_response', approval_request_id: request.id, approve: true }],
      }),
      OpenAI.BadRequestError,
    );
  });

  test('delete removes the conversation; then the response is not found', async () => {
    const client = clientOf(server);
    const response = await client.responses.create({ input: 'short lived' });
    await client.responses.delete(response.id);
    await assert.rejects(client.responses.retrieve(response.id), OpenAI.NotFoundError);
  });

  test('typed errors: unsupported fields, hosted tools, unknown ids, bad keys', async () => {
    const client = clientOf(server);
    await assert.rejects(
      client.responses.create({ input: 'x', temperature: 0.2, reasoning: { effort: 'high' } }),
      (e) => e instanceof OpenAI.BadRequestError && /temperature/.test(e.message) && /reasoning/.test(e.message),
    );
    await assert.rejects(
      client.responses.create({ input: 'x', tools: [{ type: 'web_search' }] }),
      (e) => e instanceof OpenAI.BadRequestError && /web_search/.test(e.message),
    );
    await assert.rejects(
      client.responses.create({ input: 'x', model: 'gpt-9' }),
      (e) => e instanceof OpenAI.BadRequestError && /gpt-9/.test(e.message),
    );
    await assert.rejects(client.responses.retrieve('resp_nope'), OpenAI.NotFoundError);
    await assert.rejects(
      clientOf(server, 'tah_not_a_key').responses.create({ input: 'x' }),
      OpenAI.AuthenticationError,
    );
  });

  test('tenants: another tenant sees no response; a viewer may not create; a session token reaches its own', async () => {
    const mine = clientOf(server, await keyFor(server, 'acme'));
    const theirs = clientOf(server, await keyFor(server, 'globex'));
    const response = await mine.responses.create({ input: 'private' });
    await assert.rejects(theirs.responses.retrieve(response.id), OpenAI.NotFoundError);
    await assert.rejects(
      theirs.responses.create({ input: 'hijack', previous_response_id: response.id }),
      OpenAI.NotFoundError,
    );
    await assert.rejects(theirs.responses.inputItems.list(response.id), OpenAI.NotFoundError);
    const viewer = clientOf(server, await keyFor(server, 'acme', 'viewer'));
    await assert.rejects(viewer.responses.create({ input: 'no' }), OpenAI.PermissionDeniedError);
    const { body: token } = await tah(server, 'POST', `/v1/sessions/${sessionOf(response)}/tokens`, { scope: 'interact' });
    const scoped = clientOf(server, token.token);
    assert.equal((await scoped.responses.retrieve(response.id)).id, response.id);
    const next = await scoped.responses.create({ input: 'through the token', previous_response_id: response.id });
    assert.equal(next.conversation.id, response.conversation.id);
    const other = await mine.responses.create({ input: 'another conversation' });
    await assert.rejects(scoped.responses.retrieve(other.id), OpenAI.PermissionDeniedError);
    await assert.rejects(scoped.responses.create({ input: 'new one' }), OpenAI.PermissionDeniedError);
  });
});

describe('openai Responses in the background against tah (slow mock model)', () => {
  const server = suiteServer({ mockDelayMs: 40, extraArgs: ['--api-token', OPERATOR] });

  test('background returns at once; a dropped stream resumes exactly with starting_after', async () => {
    const client = clientOf(server);
    const started = await client.responses.create({ input: 'a long answer please', background: true });
    assert.ok(['queued', 'in_progress'].includes(started.status), started.status);
    assert.equal(started.background, true);
    // Read a few events, then drop the connection.
    const seen = [];
    const first = await client.responses.retrieve(started.id, { stream: true });
    for await (const event of first) {
      seen.push(event);
      if (event.type === 'response.output_text.delta') break;
    }
    first.controller.abort();
    const last = seen.at(-1).sequence_number;
    const rest = await collect(await client.responses.retrieve(started.id, { stream: true, starting_after: last }));
    assert.ok(rest[0].sequence_number > last);
    assert.equal(rest.at(-1).type, 'response.completed');
    const whole = await collect(await client.responses.retrieve(started.id, { stream: true }));
    assert.deepEqual([...seen, ...rest], whole);
    const done = await client.responses.retrieve(started.id);
    assert.equal(done.status, 'completed');
    assert.equal(
      done.output_text,
      whole.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join(''),
    );
  });

  test('cancel ends a background response as cancelled', async () => {
    const client = clientOf(server);
    const started = await client.responses.create({ input: 'something slow', background: true });
    const cancelled = await client.responses.cancel(started.id);
    assert.equal(cancelled.status, 'cancelled');
    await until(async () => (await client.responses.retrieve(started.id)).status === 'cancelled', 'cancelled');
    // The conversation goes on with a new response.
    const next = await client.responses.create({ input: 'after the cancel', previous_response_id: started.id });
    assert.equal(next.status, 'completed');
  });
});

/** Reads an agents session's event stream until `stop(event)`; the events read. */
async function readUntil(stream, stop) {
  const events = [];
  for await (const event of stream) {
    events.push(event);
    if (stop(event)) break;
  }
  stream.controller.abort();
  return events;
}

const ends = (e) => ['agent.session.idle', 'agent.session.failed', 'agent.session.requires_action'].includes(e.type);

function eventNumbers(events) {
  return events.map((e) => Number(e.event_id.replace('evt_', '')));
}

describe('openai Agents API against tah (mock model)', () => {
  const server = suiteServer({ extraArgs: ['--api-token', OPERATOR] });

  test('agents are tah agents: create, retrieve, list, update, delete', async () => {
    const client = clientOf(server);
    const agent = await client.beta.agents.create({
      model: 'mock', name: 'helper', instructions: 'Be helpful.', tools: [askUser], metadata: { team: 'a' },
    });
    assert.equal(agent.object, 'agent');
    assert.equal(agent.name, 'helper');
    assert.equal(agent.instructions, 'Be helpful.');
    assert.deepEqual(agent.tools.map((t) => t.name), ['ask_user']);
    const { body: stored } = await tah(server, 'GET', `/v1/agents/${agent.id}`);
    assert.equal(stored.name, 'helper');
    assert.equal((await client.beta.agents.retrieve(agent.id)).id, agent.id);
    const listed = await client.beta.agents.list();
    assert.ok(listed.data.some((a) => a.id === agent.id));
    const updated = await client.beta.agents.update(agent.id, { name: 'helper-2' });
    assert.equal(updated.name, 'helper-2');
    const deleted = await client.beta.agents.delete(agent.id);
    assert.equal(deleted.deleted, true);
  });

  test('a session on an agent: a turn streams turn, item and idle events with exact resume ids', async () => {
    const client = clientOf(server);
    const agent = await client.beta.agents.create({ model: 'mock', name: 'streamer' });
    const session = await client.beta.agents.sessions.create({
      agent_id: agent.id, environment: { type: 'none' }, metadata: { run: 'one' },
    });
    assert.equal(session.object, 'agent.session');
    assert.equal(session.status, 'idle');
    assert.deepEqual(session.metadata, { run: 'one' });
    const stream = await client.beta.agents.sessions.events.stream(session.id);
    await client.beta.agents.sessions.events.create(session.id, {
      events: [{ type: 'agent.session.input.message', input: [{ role: 'user', content: [{ type: 'input_text', text: 'hello agents' }] }] }],
    });
    const events = await readUntil(stream, ends);
    const types = events.map((e) => e.type);
    for (const t of [
      'agent.session.turn.created', 'agent.session.turn.in_progress', 'agent.session.in_progress',
      'agent.session.turn.item.added', 'agent.session.turn.output_text.delta', 'agent.session.turn.item.done',
      'agent.session.turn.completed', 'agent.session.idle',
    ]) assert.ok(types.includes(t), t);
    const numbers = eventNumbers(events);
    for (let i = 1; i < numbers.length; i++) assert.ok(numbers[i - 1] < numbers[i]);
    // Resume after any id: exactly what follows it.
    const cut = numbers[Math.floor(numbers.length / 2)];
    const resumed = await client.beta.agents.sessions.events.stream(session.id, { headers: { 'Last-Event-ID': String(cut) } });
    const rest = await readUntil(resumed, (e) => e.type === 'agent.session.idle');
    assert.deepEqual(rest, events.filter((e) => Number(e.event_id.slice(4)) > cut));
    const turns = await client.beta.agents.sessions.turns.list(session.id);
    assert.equal(turns.data.length, 1);
    assert.equal(turns.data[0].status, 'completed');
    const turn = await client.beta.agents.sessions.turns.retrieve(turns.data[0].id, { session_id: session.id });
    assert.equal(turn.id, turns.data[0].id);
    const turnItems = await client.beta.agents.sessions.turns.items.list(turn.id, { session_id: session.id });
    assert.ok(turnItems.data.length >= 2);
    assert.ok(turnItems.data.every((i) => i.turn_id === turn.id));
    // An update may repeat the session's metadata; changing it is refused.
    assert.deepEqual((await client.beta.agents.sessions.update(session.id, { metadata: { run: 'one' } })).metadata, { run: 'one' });
    await assert.rejects(client.beta.agents.sessions.update(session.id, { metadata: { run: 'two' } }), OpenAI.BadRequestError);
    const items = await client.beta.agents.sessions.items.list(session.id);
    assert.equal(items.data[0].type, 'message');
    assert.equal(items.data[0].role, 'user');
    assert.equal(items.data.at(-1).role, 'assistant');
    assert.match(items.data.at(-1).content[0].text, /hello agents/);
    const listed = await client.beta.agents.sessions.list({ agent_id: agent.id });
    assert.deepEqual(listed.data.map((s) => s.id), [session.id]);
  });

  test('requires_action for a function tool, answered by tool_result; items, pagination', async () => {
    const client = clientOf(server);
    const session = await client.beta.agents.sessions.create({
      agent: { model: 'mock', instructions: 'Ask when unsure.', tools: [askUser] }, environment: { type: 'openai_hosted' },
    });
    const stream = await client.beta.agents.sessions.events.stream(session.id);
    await client.beta.agents.sessions.events.create(session.id, {
      events: [{ type: 'agent.session.input.message', input: [{ role: 'user', content: [{ type: 'input_text', text: 'ask the client for a colour' }] }] }],
    });
    const first = await readUntil(stream, ends);
    const waiting = first.at(-1);
    assert.equal(waiting.type, 'agent.session.requires_action');
    const [action] = waiting.session.required_actions;
    assert.equal(action.type, 'function_call');
    assert.equal(action.name, 'ask_user');
    const again = await client.beta.agents.sessions.retrieve(session.id);
    assert.equal(again.status, 'requires_action');
    const next = await client.beta.agents.sessions.events.stream(session.id);
    await client.beta.agents.sessions.events.create(session.id, {
      events: [{ type: 'agent.session.input.tool_result', call_id: action.call_id, turn_id: action.turn_id, success: true, output: 'green' }],
    });
    const second = await readUntil(next, ends);
    assert.equal(second.at(-1).type, 'agent.session.idle');
    const items = await client.beta.agents.sessions.items.list(session.id);
    const output = items.data.find((i) => i.type === 'function_call_output');
    assert.equal(output.output, 'green');
    // Pages of two, following `after`.
    const ids = [];
    for await (const item of client.beta.agents.sessions.items.list(session.id, { limit: 2 })) ids.push(item.id);
    assert.deepEqual(ids, items.data.map((i) => i.id));
  });

  test('a streamed create runs the SDK\'s local tool handlers and gives the final result', async () => {
    const client = clientOf(server);
    const stream = await client.beta.agents.sessions.create({
      environment: { type: 'none' },
      agent: { model: 'mock', tools: [askUser] },
      input: 'ask the client for a number',
      stream: true,
      toolHandlers: { ask_user: async ({ question }) => `42 for ${question.length} characters` },
    });
    const result = await stream.finalResult();
    assert.equal(result.turn.status, 'completed');
    assert.match(result.messages.at(-1).content[0].text, /42 for 27 characters/);
    const items = await client.beta.agents.sessions.items.list(result.turn.session_id);
    assert.ok(items.data.some((i) => i.type === 'function_call_output'));
  });

  test('an approval is a required action; tool_result allows it; the artifact downloads', async () => {
    const client = clientOf(server);
    const session = await client.beta.agents.sessions.create({ environment: { type: 'none' }, input: 'write a note about otters' });
    const stream = await client.beta.agents.sessions.events.stream(session.id, { headers: { 'Last-Event-ID': '0' } });
    const first = await readUntil(stream, ends);
    const action = first.at(-1).session.required_actions[0];
    assert.equal(action.name, 'write_file');
    const next = await client.beta.agents.sessions.events.stream(session.id);
    await client.beta.agents.sessions.events.create(session.id, {
      events: [{ type: 'agent.session.input.tool_result', call_id: action.call_id, turn_id: action.turn_id, success: true }],
    });
    await readUntil(next, ends);
    const artifacts = await client.beta.agents.sessions.artifacts.list(session.id);
    assert.deepEqual(artifacts.data.map((a) => a.path), ['notes.md']);
    const content = await client.beta.agents.sessions.artifacts.content(artifacts.data[0].id, { session_id: session.id });
    assert.match(await content.text(), /otters/);
    const one = await client.beta.agents.sessions.artifacts.retrieve(artifacts.data[0].id, { session_id: session.id });
    assert.equal(one.path, 'notes.md');
  });

  test('subagents are the sub-agent sessions of task calls', async () => {
    const client = clientOf(server);
    const session = await client.beta.agents.sessions.create({ environment: { type: 'none' }, input: 'delegate this' });
    const stream = await client.beta.agents.sessions.events.stream(session.id, { headers: { 'Last-Event-ID': '0' } });
    const first = await readUntil(stream, ends);
    const action = first.at(-1).session.required_actions[0];
    assert.equal(action.name, 'task');
    const next = await client.beta.agents.sessions.events.stream(session.id);
    await client.beta.agents.sessions.events.create(session.id, {
      events: [{ type: 'agent.session.input.tool_result', call_id: action.call_id, turn_id: action.turn_id, success: true }],
    });
    const second = await readUntil(next, ends);
    assert.ok(second.some((e) => e.type === 'agent.session.subagent.created'));
    const subagents = await client.beta.agents.sessions.subagents.list(session.id);
    assert.equal(subagents.data.length, 1);
    assert.equal(subagents.data[0].status, 'closed');
    const one = await client.beta.agents.sessions.subagents.retrieve(subagents.data[0].id, { session_id: session.id });
    assert.equal(one.id, subagents.data[0].id);
    const childItems = await client.beta.agents.sessions.subagents.items.list(subagents.data[0].id, { session_id: session.id });
    assert.equal(childItems.data[0].role, 'user');
    const childTurns = await client.beta.agents.sessions.subagents.turns.list(subagents.data[0].id, { session_id: session.id });
    assert.deepEqual(childTurns.data.map((t) => t.status), ['completed']);
    const childTurn = await client.beta.agents.sessions.subagents.turns.retrieve(childTurns.data[0].id, {
      session_id: session.id, subagent_id: subagents.data[0].id,
    });
    assert.equal(childTurn.session_id, subagents.data[0].id);
    const childTurnItems = await client.beta.agents.sessions.subagents.turns.items.list(childTurns.data[0].id, {
      session_id: session.id, subagent_id: subagents.data[0].id,
    });
    assert.deepEqual(childTurnItems.data.map((i) => i.id), childItems.data.map((i) => i.id));
  });

  test('typed errors: self_hosted, unknown and another tenant\'s sessions, bad events, viewers', async () => {
    const client = clientOf(server);
    await assert.rejects(
      client.beta.agents.sessions.create({ environment: { type: 'self_hosted' } }),
      (e) => e instanceof OpenAI.BadRequestError && /remote workers/.test(e.message),
    );
    await assert.rejects(
      client.beta.agents.sessions.create({ environment: { type: 'none' }, vault_ids: ['v1'] }),
      (e) => e instanceof OpenAI.BadRequestError && /vault_ids/.test(e.message),
    );
    await assert.rejects(client.beta.agents.sessions.retrieve('00000000-0000-0000-0000-000000000000'), OpenAI.NotFoundError);
    const mine = clientOf(server, await keyFor(server, 'initech'));
    const theirs = clientOf(server, await keyFor(server, 'umbrella'));
    const session = await mine.beta.agents.sessions.create({ environment: { type: 'none' } });
    await assert.rejects(theirs.beta.agents.sessions.retrieve(session.id), OpenAI.NotFoundError);
    await assert.rejects(theirs.beta.agents.sessions.items.list(session.id), OpenAI.NotFoundError);
    await assert.rejects(
      theirs.beta.agents.sessions.events.create(session.id, { events: [{ type: 'agent.session.input.cancel' }] }),
      OpenAI.NotFoundError,
    );
    assert.equal((await theirs.beta.agents.sessions.list()).data.length, 0);
    await assert.rejects(
      mine.beta.agents.sessions.events.create(session.id, { events: [{ type: 'agent.session.input.nope' }] }),
      OpenAI.BadRequestError,
    );
    const viewer = clientOf(server, await keyFor(server, 'initech', 'viewer'));
    await assert.rejects(viewer.beta.agents.sessions.create({ environment: { type: 'none' } }), OpenAI.PermissionDeniedError);
    await assert.rejects(viewer.beta.agents.create({ model: 'mock' }), OpenAI.PermissionDeniedError);
  });
});

describe('openai Agents API in long turns against tah (slow mock model)', () => {
  const server = suiteServer({ mockDelayMs: 40, extraArgs: ['--api-token', OPERATOR] });

  test('a message during a turn steers it; cancel ends a turn; Idempotency-Key sends once', async () => {
    const client = clientOf(server);
    const session = await client.beta.agents.sessions.create({ environment: { type: 'none' } });
    const stream = await client.beta.agents.sessions.events.stream(session.id);
    const say = (text, key) => client.beta.agents.sessions.events.create(
      session.id,
      { events: [{ type: 'agent.session.input.message', input: [{ role: 'user', content: [{ type: 'input_text', text }] }] }] },
      key ? { headers: { 'Idempotency-Key': key } } : undefined,
    );
    await say('first question', 'k-1');
    await say('first question', 'k-1'); // a retry: not a second message
    await until(async () => (await client.beta.agents.sessions.retrieve(session.id)).status === 'in_progress', 'in progress');
    await say('and also this');
    const events = await readUntil(stream, ends);
    const turnIds = new Set(events.filter((e) => e.type === 'agent.session.turn.created').map((e) => e.turn_id));
    assert.equal(turnIds.size, 1);
    const users = events.filter((e) => e.type === 'agent.session.turn.item.added' && e.item.role === 'user');
    assert.deepEqual(users.map((e) => e.item.content[0].text), ['first question', 'and also this']);
    assert.deepEqual(new Set(users.map((e) => e.turn_id)), turnIds);
    // Cancel.
    const next = await client.beta.agents.sessions.events.stream(session.id);
    await say('a slow one');
    await until(async () => (await client.beta.agents.sessions.retrieve(session.id)).status === 'in_progress', 'in progress');
    await client.beta.agents.sessions.events.create(session.id, { events: [{ type: 'agent.session.input.cancel' }] });
    const cancelled = await readUntil(next, ends);
    assert.ok(cancelled.some((e) => e.type === 'agent.session.turn.cancelled'));
    const turns = await client.beta.agents.sessions.turns.list(session.id);
    assert.deepEqual(turns.data.map((t) => t.status), ['completed', 'cancelled']);
    const deleted = await client.beta.agents.sessions.delete(session.id);
    assert.equal(deleted.deleted, true);
  });
});
