// Anthropic's own SDK (`@anthropic-ai/sdk`, pinned), `client.beta.*` (Claude Managed Agents),
// against tah's `/anthropic` face: agents with versions, the local environment, sessions, a
// streamed turn whose agent.message is tah's own record, approvals, a custom tool, an
// interrupt, a stream resumed with Last-Event-ID, typed errors and tenants.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';

import { startTah } from './support/server.mjs';

const OPERATOR = 'anthropic-face-operator-token';

/** A new key of `tenant` with `role`, made by the operator (`POST /v1/keys`). */
async function makeKey(server, tenant, role) {
  const response = await fetch(`${server.url}/v1/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${OPERATOR}`, 'content-type': 'application/json' },
    body: JSON.stringify({ tenant, role, name: `${tenant}-${role}` }),
  });
  assert.equal(response.status, 201);
  return (await response.json()).key;
}

const clientFor = (server, apiKey) => new Anthropic({ baseURL: `${server.url}/anthropic`, apiKey, maxRetries: 0 });

/** Reads the SDK's event stream until `stop(event)` is true; returns every event read. */
async function readUntil(stream, stop) {
  const seen = [];
  for await (const event of stream) {
    seen.push(event);
    if (stop(event)) break;
  }
  return seen;
}

const idle = (reason) => (e) => e.type === 'session.status_idle' && e.stop_reason.type === reason;

/** Every event of the session, through the SDK's cursor pages. */
async function allEvents(client, sessionId, params = {}) {
  const all = [];
  for await (const event of client.beta.sessions.events.list(sessionId, { limit: 3, ...params })) all.push(event);
  return all;
}

/** tah's own record of the session's assistant messages (`GET /v1/sessions/{id}/messages`). */
async function assistantTexts(server, key, sessionId) {
  const response = await fetch(`${server.url}/v1/sessions/${sessionId}/messages?limit=500`, {
    headers: { authorization: `Bearer ${key}` },
  });
  assert.equal(response.status, 200);
  const { data } = await response.json();
  return data.filter((m) => m.role === 'assistant' && m.content).map((m) => m.content);
}

describe('@anthropic-ai/sdk client.beta against tah', () => {
  let server;
  let admin;
  let member;
  let other;
  let adminKey;
  let memberKey;
  let agent;

  before(async () => {
    server = await startTah({ mockDelayMs: 5, extraArgs: ['--api-token', OPERATOR] });
    adminKey = await makeKey(server, 'acme', 'admin');
    memberKey = await makeKey(server, 'acme', 'member');
    admin = clientFor(server, adminKey);
    member = clientFor(server, memberKey);
    other = clientFor(server, await makeKey(server, 'globex', 'admin'));
    agent = await admin.beta.agents.create({
      name: 'helper',
      model: 'mock',
      system: 'Be brief.',
      tools: [
        { type: 'agent_toolset_20260401', default_config: { permission_policy: { type: 'auto' } } },
        {
          type: 'custom',
          name: 'lookup',
          description: 'Looks something up on the client',
          input_schema: { type: 'object', properties: { question: { type: 'string' } } },
        },
      ],
      metadata: { team: 'docs' },
    });
  });
  after(async () => {
    await server?.close();
  });

  test('agents: create, retrieve, update makes versions, list versions, archive', async () => {
    assert.equal(agent.type, 'agent');
    assert.equal(agent.version, 1);
    assert.equal(agent.model.id, 'mock');
    assert.equal(agent.system, 'Be brief.');
    assert.deepEqual(agent.metadata, { team: 'docs' });
    assert.ok(agent.tools.some((t) => t.type === 'custom' && t.name === 'lookup'));
    const made = await admin.beta.agents.create({ name: 'scratch', model: { id: 'mock' } });
    const updated = await admin.beta.agents.update(made.id, { version: 1, system: 'Answer in French.' });
    assert.equal(updated.version, 2);
    assert.equal(updated.system, 'Answer in French.');
    const first = await admin.beta.agents.retrieve(made.id, { version: 1 });
    assert.equal(first.system, null);
    const versions = [];
    for await (const v of admin.beta.agents.versions.list(made.id, { limit: 1 })) versions.push(v.version);
    assert.deepEqual(versions, [2, 1]);
    // An update from a version that is no longer the latest is refused.
    await assert.rejects(admin.beta.agents.update(made.id, { version: 1, name: 'late' }), Anthropic.ConflictError);
    const listed = [];
    for await (const a of admin.beta.agents.list({ limit: 1 })) listed.push(a.id);
    assert.ok(listed.includes(made.id) && listed.includes(agent.id));
    const archived = await admin.beta.agents.archive(made.id);
    assert.ok(archived.archived_at);
    const after = [];
    for await (const a of admin.beta.agents.list()) after.push(a.id);
    assert.ok(!after.includes(made.id));
  });

  test('environments: the local workspace; cloud maps to it, self_hosted is refused', async () => {
    const page = await admin.beta.environments.list();
    assert.deepEqual(page.data.map((e) => e.id), ['env_local']);
    const made = await admin.beta.environments.create({ name: 'ci', config: { type: 'cloud' } });
    assert.equal(made.id, 'env_local');
    assert.equal(made.name, 'ci');
    assert.equal((await admin.beta.environments.retrieve('env_local')).config.type, 'cloud');
    await assert.rejects(
      admin.beta.environments.create({ name: 'w', config: { type: 'self_hosted' } }),
      (e) => e instanceof Anthropic.BadRequestError && /self_hosted/.test(e.message),
    );
    await assert.rejects(admin.beta.environments.retrieve('env_other'), Anthropic.NotFoundError);
  });

  test('sessions: create, list pages, retrieve, update, archive, delete; tah sees them', async () => {
    const ids = [];
    for (const title of ['one', 'two', 'three']) {
      const s = await member.beta.sessions.create({
        agent: { type: 'agent', id: agent.id, version: 1 },
        environment_id: 'env_local',
        title,
        metadata: { n: title },
      });
      assert.equal(s.type, 'session');
      assert.equal(s.status, 'idle');
      assert.equal(s.agent.id, agent.id);
      assert.equal(s.environment_id, 'env_local');
      ids.push(s.id);
    }
    const listed = [];
    for await (const s of member.beta.sessions.list({ limit: 2 })) listed.push(s.id);
    assert.deepEqual(listed.slice(0, 3), [...ids].reverse());
    const updated = await member.beta.sessions.update(ids[0], { title: 'first', metadata: { n: null, k: 'v' } });
    assert.equal(updated.title, 'first');
    assert.deepEqual(updated.metadata, { k: 'v' });
    // tah's own API shows the same session.
    const own = await fetch(`${server.url}/v1/sessions/${ids[0]}`, { headers: { 'x-api-key': memberKey } });
    assert.equal((await own.json()).title, 'first');
    const archived = await member.beta.sessions.archive(ids[1]);
    assert.ok(archived.archived_at);
    const unarchived = [];
    for await (const s of member.beta.sessions.list()) unarchived.push(s.id);
    assert.ok(!unarchived.includes(ids[1]));
    const withArchived = [];
    for await (const s of member.beta.sessions.list({ include_archived: true })) withArchived.push(s.id);
    assert.ok(withArchived.includes(ids[1]));
    const deleted = await member.beta.sessions.delete(ids[2]);
    assert.deepEqual(deleted, { id: ids[2], type: 'session_deleted' });
    await assert.rejects(member.beta.sessions.retrieve(ids[2]), Anthropic.NotFoundError);
  });

  test("a streamed turn: agent.message is tah's record, ids increase, the list agrees", async () => {
    const session = await member.beta.sessions.create({ agent: agent.id, environment_id: 'env_local' });
    const stream = await member.beta.sessions.events.stream(session.id, { event_deltas: ['agent.message'] });
    await member.beta.sessions.events.send(session.id, {
      events: [{ type: 'user.message', content: [{ type: 'text', text: 'Hello there' }] }],
    });
    const seen = await readUntil(stream, idle('end_turn'));
    const events = seen.filter((e) => e.type !== 'event_start' && e.type !== 'event_delta');
    const types = events.map((e) => e.type);
    assert.equal(types[0], 'session.status_running');
    assert.ok(types.includes('user.message'));
    assert.ok(types.includes('span.model_request_start'));
    assert.ok(types.includes('span.model_request_end'));
    assert.ok(types.includes('session.usage'));
    const messages = events.filter((e) => e.type === 'agent.message').map((e) => e.content.map((b) => b.text).join(''));
    assert.ok(messages.length >= 1);
    assert.deepEqual(messages, await assistantTexts(server, memberKey, session.id));
    // The deltas of the last message add up to it.
    const last = events.filter((e) => e.type === 'agent.message').at(-1);
    const deltas = seen.filter((e) => e.type === 'event_delta' && e.event_id === last.id);
    assert.equal(deltas.map((d) => d.delta.content.text).join(''), messages.at(-1));
    // The list (in pages of 3) is the same events, and the types filter works.
    const listed = await allEvents(member, session.id);
    assert.deepEqual(listed.map((e) => e.id), events.map((e) => e.id));
    const onlyMessages = await allEvents(member, session.id, { types: ['agent.message'] });
    assert.deepEqual(
      onlyMessages.map((e) => e.id),
      events.filter((e) => e.type === 'agent.message').map((e) => e.id),
    );
    const desc = await allEvents(member, session.id, { order: 'desc' });
    assert.deepEqual(desc.map((e) => e.id), listed.map((e) => e.id).reverse());
    assert.equal((await member.beta.sessions.retrieve(session.id)).status, 'idle');
  });

  test('approvals: requires_action names the call, user.tool_confirmation answers it', async () => {
    const session = await member.beta.sessions.create({ agent: agent.id, environment_id: 'env_local' });
    let stream = await member.beta.sessions.events.stream(session.id);
    await member.beta.sessions.events.send(session.id, {
      events: [{ type: 'user.message', content: [{ type: 'text', text: 'run `echo approved`' }] }],
    });
    let seen = await readUntil(stream, idle('requires_action'));
    const use = seen.find((e) => e.type === 'agent.tool_use');
    assert.equal(use.name, 'bash');
    assert.equal(use.evaluated_permission, 'ask');
    assert.deepEqual(seen.at(-1).stop_reason.event_ids, [use.id]);
    assert.equal((await member.beta.sessions.retrieve(session.id)).status, 'idle');
    stream = await member.beta.sessions.events.stream(session.id);
    await member.beta.sessions.events.send(session.id, {
      events: [{ type: 'user.tool_confirmation', tool_use_id: use.id, result: 'allow' }],
    });
    seen = await readUntil(stream, idle('end_turn'));
    const types = seen.map((e) => e.type);
    assert.ok(types.indexOf('user.tool_confirmation') < types.indexOf('agent.tool_result'));
    const result = seen.find((e) => e.type === 'agent.tool_result');
    assert.equal(result.tool_use_id, use.id);
    assert.match(result.content[0].text, /approved/);
    // A denial with a message.
    stream = await member.beta.sessions.events.stream(session.id);
    await member.beta.sessions.events.send(session.id, {
      events: [{ type: 'user.message', content: [{ type: 'text', text: 'run `echo no`' }] }],
    });
    seen = await readUntil(stream, idle('requires_action'));
    const second = seen.find((e) => e.type === 'agent.tool_use');
    stream = await member.beta.sessions.events.stream(session.id);
    await member.beta.sessions.events.send(session.id, {
      events: [{ type: 'user.tool_confirmation', tool_use_id: second.id, result: 'deny', deny_message: 'not now' }],
    });
    seen = await readUntil(stream, idle('end_turn'));
    const confirmation = seen.find((e) => e.type === 'user.tool_confirmation');
    assert.equal(confirmation.result, 'deny');
    assert.equal(confirmation.deny_message, 'not now');
    assert.equal(seen.find((e) => e.type === 'agent.tool_result').is_error, true);
  });

  test('a custom tool: agent.custom_tool_use answered by user.custom_tool_result', async () => {
    const session = await member.beta.sessions.create({ agent: agent.id, environment_id: 'env_local' });
    let stream = await member.beta.sessions.events.stream(session.id);
    await member.beta.sessions.events.send(session.id, {
      events: [{ type: 'user.message', content: [{ type: 'text', text: 'ask the client for the weather' }] }],
    });
    let seen = await readUntil(stream, idle('requires_action'));
    const use = seen.find((e) => e.type === 'agent.custom_tool_use');
    assert.ok(use, JSON.stringify(seen));
    assert.equal(use.name, 'lookup');
    assert.deepEqual(seen.at(-1).stop_reason.event_ids, [use.id]);
    stream = await member.beta.sessions.events.stream(session.id);
    await member.beta.sessions.events.send(session.id, {
      events: [{ type: 'user.custom_tool_result', custom_tool_use_id: use.id, content: [{ type: 'text', text: 'sunny' }] }],
    });
    seen = await readUntil(stream, idle('end_turn'));
    const result = seen.find((e) => e.type === 'user.custom_tool_result');
    assert.equal(result.custom_tool_use_id, use.id);
    const messages = seen.filter((e) => e.type === 'agent.message').map((e) => e.content[0].text);
    assert.match(messages.at(-1), /sunny/);
  });

  test("the SDK's session tool runner answers a custom tool", async () => {
    const session = await member.beta.sessions.create({ agent: agent.id, environment_id: 'env_local' });
    const controller = new AbortController();
    const lookup = {
      type: 'custom',
      name: 'lookup',
      description: 'Looks something up on the client',
      input_schema: { type: 'object', properties: { question: { type: 'string' } } },
      parse: (input) => input,
      run: async (input) => `cloudy, asked: ${input.question}`,
    };
    const runner = member.beta.sessions.events.toolRunner(session.id, {
      tools: [lookup],
      signal: controller.signal,
      maxIdleMs: 0,
    });
    const stream = await member.beta.sessions.events.stream(session.id);
    await member.beta.sessions.events.send(session.id, {
      events: [{ type: 'user.message', content: [{ type: 'text', text: 'ask the client about the sky' }] }],
    });
    const calls = [];
    const running = (async () => {
      for await (const call of runner) {
        calls.push(call);
        if (call.name === 'lookup') break;
      }
    })();
    const seen = await readUntil(stream, idle('end_turn'));
    await running;
    controller.abort();
    const dispatched = calls.find((c) => c.name === 'lookup');
    assert.ok(dispatched?.posted, JSON.stringify(calls));
    const result = seen.find((e) => e.type === 'user.custom_tool_result');
    assert.match(result.content[0].text, /cloudy/);
    assert.match(seen.filter((e) => e.type === 'agent.message').at(-1).content[0].text, /cloudy/);
  });

  test('user.interrupt cancels the running turn', async () => {
    const slow = await startTah({ mockDelayMs: 300 });
    try {
      const client = clientFor(slow, 'unused');
      const session = await client.beta.sessions.create({ agent: 'default', environment_id: 'env_local' });
      const stream = await client.beta.sessions.events.stream(session.id);
      await client.beta.sessions.events.send(session.id, {
        events: [{ type: 'user.message', content: [{ type: 'text', text: 'Tell me a long story' }] }],
      });
      const seen = [];
      for await (const event of stream) {
        seen.push(event);
        if (event.type === 'span.model_request_start') {
          await client.beta.sessions.events.send(session.id, { events: [{ type: 'user.interrupt' }] });
        }
        if (event.type === 'session.status_idle') break;
      }
      assert.equal(seen.at(-1).stop_reason.type, 'end_turn');
      assert.equal((await slow.session(session.id)).state, 'cancelled');
    } finally {
      await slow.close();
    }
  });

  test('a stream dropped mid-turn resumes with Last-Event-ID: no gap, no duplicate', async () => {
    const slow = await startTah({ mockDelayMs: 40 });
    try {
      const client = clientFor(slow, 'unused');
      const session = await client.beta.sessions.create({ agent: 'default', environment_id: 'env_local' });
      // The SDK does not show SSE ids: the first connection is read with fetch, and dropped
      // after a few frames, mid-turn.
      const url = `${slow.url}/anthropic/v1/sessions/${session.id}/events/stream`;
      const controller = new AbortController();
      const response = await fetch(url, { signal: controller.signal });
      assert.equal(response.status, 200);
      await client.beta.sessions.events.send(session.id, {
        events: [{ type: 'user.message', content: [{ type: 'text', text: 'Please think about the workspace' }] }],
      });
      const head = [];
      let lastId;
      const decoder = new TextDecoder();
      let buffer = '';
      outer: for await (const chunk of response.body) {
        buffer += decoder.decode(chunk, { stream: true });
        let cut;
        while ((cut = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const data = block.match(/^data: ?(.*)$/m)?.[1];
          if (!data) continue;
          const id = Number(block.match(/^id: ?(.*)$/m)[1]);
          assert.ok(lastId === undefined || id > lastId);
          lastId = id;
          head.push(JSON.parse(data));
          if (head.length === 4) break outer;
        }
      }
      controller.abort();
      assert.notEqual((await slow.session(session.id)).state, 'completed', 'dropped mid-turn');
      // The SDK reconnects with Last-Event-ID.
      const resumed = await client.beta.sessions.events.stream(session.id, {}, { headers: { 'Last-Event-ID': String(lastId) } });
      const rest = await readUntil(resumed, idle('end_turn'));
      const all = await allEvents(client, session.id);
      assert.deepEqual([...head, ...rest].map((e) => e.id), all.map((e) => e.id));
      assert.equal(new Set(all.map((e) => e.id)).size, all.length);
    } finally {
      await slow.close();
    }
  });

  test('typed errors and tenants', async () => {
    const session = await member.beta.sessions.create({ agent: agent.id, environment_id: 'env_local' });
    await assert.rejects(clientFor(server, 'tah_not_a_key').beta.sessions.list(), Anthropic.AuthenticationError);
    await assert.rejects(member.beta.sessions.retrieve('0190c0de-0000-7000-8000-000000000000'), Anthropic.NotFoundError);
    await assert.rejects(
      member.beta.sessions.create({ agent: agent.id, environment_id: 'env_local', vault_ids: ['v1'] }),
      (e) => e instanceof Anthropic.BadRequestError && /vault_ids/.test(e.message),
    );
    await assert.rejects(
      member.beta.sessions.events.send(session.id, {
        events: [{ type: 'user.message', content: [{ type: 'image', source: { type: 'url', url: 'http://x' } }] }],
      }),
      (e) => e instanceof Anthropic.BadRequestError && /content\[0\]\.type/.test(e.message),
    );
    // A member may not make agents.
    await assert.rejects(member.beta.agents.create({ name: 'x', model: 'mock' }), Anthropic.PermissionDeniedError);
    // Another tenant sees neither the agent nor the session.
    await assert.rejects(other.beta.agents.retrieve(agent.id), Anthropic.NotFoundError);
    await assert.rejects(other.beta.sessions.retrieve(session.id), Anthropic.NotFoundError);
    await assert.rejects(
      other.beta.sessions.create({ agent: agent.id, environment_id: 'env_local' }),
      Anthropic.NotFoundError,
    );
    const theirs = [];
    for await (const s of other.beta.sessions.list()) theirs.push(s.id);
    assert.ok(!theirs.includes(session.id));
  });
});
