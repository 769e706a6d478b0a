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
