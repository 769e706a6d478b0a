// tah as an MCP server, driven by the MCP SDK's own client (`Client` over
// `StreamableHTTPClientTransport`), pinned: the tools it lists, runs on new and existing
// sessions with progress, an approval answered with tah_answer, the session tools, bad
// arguments, and authentication with keys of two tenants.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { suiteServer } from './support/server.mjs';

async function connect(server, token) {
  const client = new Client({ name: 'tah-protocol-test', version: '1.0.0' });
  const headers = token ? { authorization: `Bearer ${token}` } : {};
  const transport = new StreamableHTTPClientTransport(new URL(`${server.url}/mcp`), { requestInit: { headers } });
  await client.connect(transport);
  return client;
}

const OPERATOR = 'operator-token-0123456789';

/** A new key of `tenant`, made through tah's API by the operator. */
async function key(server, tenant, role = 'member') {
  const response = await fetch(`${server.url}/v1/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${OPERATOR}`, 'content-type': 'application/json' },
    body: JSON.stringify({ tenant, role, name: `mcp-${tenant}` }),
  });
  assert.equal(response.status, 201);
  return (await response.json()).key;
}

async function call(client, name, args, options) {
  return client.callTool({ name, arguments: args }, undefined, options);
}

describe('the MCP server face', () => {
  const server = suiteServer();

  test('lists its four tools with precise input schemas', async () => {
    const client = await connect(server);
    try {
      assert.equal(client.getServerVersion().name, 'tah');
      const { tools } = await client.listTools();
      assert.deepEqual(tools.map((t) => t.name).sort(), ['tah_answer', 'tah_run', 'tah_session', 'tah_sessions']);
      const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
      assert.deepEqual(byName.tah_run.inputSchema.required, ['input']);
      assert.equal(byName.tah_run.inputSchema.additionalProperties, false);
      assert.deepEqual(byName.tah_answer.inputSchema.required, ['session_id', 'call_id']);
      assert.deepEqual(byName.tah_answer.inputSchema.properties.decision.enum, ['allow', 'deny']);
      assert.deepEqual(byName.tah_session.inputSchema.required, ['session_id']);
      assert.ok(byName.tah_run.outputSchema.required.includes('session_id'));
      assert.equal(byName.tah_sessions.annotations.readOnlyHint, true);
      assert.equal(byName.tah_session.annotations.readOnlyHint, true);
    } finally {
      await client.close();
    }
  });

  test('tah_run starts a session, reports progress, then continues that session', async () => {
    const client = await connect(server);
    try {
      const progress = [];
      const first = await call(client, 'tah_run', { input: 'hello from mcp' }, { onprogress: (p) => progress.push(p) });
      assert.equal(first.isError, false);
      const { session_id: sessionId, run_id: runId, text, status } = first.structuredContent;
      assert.equal(status, 'completed');
      assert.equal(first.content[0].text, text);
      const finished = (await server.events(sessionId)).filter((e) => e.type === 'agent.finished');
      assert.deepEqual(finished.map((e) => [e.data.run_id, e.data.text]), [[runId, text]]);
      assert.ok(progress.length >= 3, `progress: ${JSON.stringify(progress)}`);
      assert.deepEqual(progress.map((p) => p.progress), progress.map((_, i) => i + 1));
      assert.equal(progress.at(-1).message, 'run finished');

      const again = [];
      const second = await call(client, 'tah_run', { session_id: sessionId, input: 'and again' }, { onprogress: (p) => again.push(p) });
      assert.equal(second.structuredContent.session_id, sessionId);
      assert.notEqual(second.structuredContent.run_id, runId);
      assert.ok(again.length >= 3);
      const runs = (await server.api('GET', `/v1/sessions/${sessionId}/runs`)).body.data;
      assert.equal(runs.length, 2);
    } finally {
      await client.close();
    }
  });

  test('a run that waits for an approval answers what is pending; tah_answer allows or denies it', async () => {
    const client = await connect(server);
    try {
      const waiting = await call(client, 'tah_run', { input: 'write a note about the mcp face' });
      const { session_id: sessionId, status, pending } = waiting.structuredContent;
      assert.equal(status, 'waiting');
      assert.equal(pending.length, 1);
      assert.equal(pending[0].tool, 'write_file');
      assert.equal(pending[0].kind, 'approval');
      assert.match(waiting.content[0].text, /waits for approval/);
      const approvals = (await server.api('GET', `/v1/sessions/${sessionId}/approvals`)).body.data;
      assert.deepEqual(approvals.map((a) => a.call_id), [pending[0].call_id]);

      const wrong = await call(client, 'tah_answer', { session_id: sessionId, call_id: 'nope', decision: 'allow' });
      assert.equal(wrong.isError, true);
      assert.match(wrong.content[0].text, /no call "nope" of the run waits for an answer/);

      const progress = [];
      const done = await call(client, 'tah_answer', { session_id: sessionId, call_id: pending[0].call_id, decision: 'allow' }, { onprogress: (p) => progress.push(p) });
      assert.equal(done.structuredContent.status, 'completed');
      assert.equal(done.structuredContent.run_id, waiting.structuredContent.run_id);
      assert.ok(progress.length >= 1);
      assert.ok(existsSync(join(server.workspace, 'notes.md')));
      const resolved = (await server.events(sessionId)).filter((e) => e.type === 'tool.approval-resolved');
      assert.deepEqual(resolved.map((e) => [e.data.call_id, e.data.decision]), [[pending[0].call_id, 'allow']]);

      const again = await call(client, 'tah_run', { session_id: sessionId, input: 'write a note to `denied.md`' });
      const [call2] = again.structuredContent.pending;
      const denied = await call(client, 'tah_answer', { session_id: sessionId, call_id: call2.call_id, decision: 'deny', reason: 'not now' });
      assert.equal(denied.structuredContent.status, 'completed');
      assert.ok(!existsSync(join(server.workspace, 'denied.md')));
      const decisions = (await server.events(sessionId)).filter((e) => e.type === 'tool.approval-resolved').map((e) => e.data.decision);
      assert.deepEqual(decisions, ['allow', 'deny']);

      const nothing = await call(client, 'tah_answer', { session_id: sessionId, call_id: call2.call_id, decision: 'allow' });
      assert.equal(nothing.isError, true);
    } finally {
      await client.close();
    }
  });

  test('tah_sessions lists sessions and tah_session shows one with its last messages', async () => {
    const client = await connect(server);
    try {
      const run = await call(client, 'tah_run', { input: 'remember the word pineapple' });
      const sessionId = run.structuredContent.session_id;
      const listed = await call(client, 'tah_sessions', { limit: 100 });
      assert.ok(listed.structuredContent.sessions.some((s) => s.session_id === sessionId));
      const one = await call(client, 'tah_sessions', { limit: 1 });
      assert.equal(one.structuredContent.sessions.length, 1);
      const shown = await call(client, 'tah_session', { session_id: sessionId });
      assert.equal(shown.isError, false);
      assert.equal(shown.structuredContent.session_id, sessionId);
      assert.equal(shown.structuredContent.state, 'completed');
      assert.equal(shown.structuredContent.last_run.id, run.structuredContent.run_id);
      const messages = shown.structuredContent.messages;
      assert.match(messages.find((m) => m.role === 'user').content, /pineapple/);
      assert.equal(messages.at(-1).content, run.structuredContent.text);
    } finally {
      await client.close();
    }
  });

  test('bad arguments are tool errors that say what is wrong; an unknown tool is a protocol error', async () => {
    const client = await connect(server);
    try {
      const cases = [
        ['tah_run', {}, /input/],
        ['tah_run', { input: '   ' }, /input must not be empty/],
        ['tah_run', { input: 'hi', extra: 1 }, /unknown field `extra`/],
        ['tah_run', { input: 'hi', session_id: 'nope' }, /session_id must be a session id/],
        ['tah_run', { input: 'hi', session_id: '00000000-0000-4000-8000-000000000000' }, /session not found/],
        ['tah_run', { input: 'hi', agent: 'no-such-agent' }, /agent/],
        ['tah_answer', { session_id: '00000000-0000-4000-8000-000000000000', call_id: 'x', decision: 'maybe' }, /decision|unknown variant/],
        ['tah_sessions', { limit: 0 }, /limit must be between 1 and 100/],
        ['tah_session', { session_id: 42 }, /invalid type/],
      ];
      for (const [name, args, pattern] of cases) {
        const result = await call(client, name, args);
        assert.equal(result.isError, true, `${name} ${JSON.stringify(args)}`);
        assert.match(result.content[0].text, pattern, `${name} ${JSON.stringify(args)}`);
      }
      await assert.rejects(call(client, 'tah_nothing', {}), /no tool named/);
    } finally {
      await client.close();
    }
  });
});

describe('the MCP server face with keys', () => {
  const server = suiteServer({ extraArgs: ['--api-token', OPERATOR] });

  test('needs a key; each key acts in its tenant and never sees another tenant\'s session', async () => {
    await assert.rejects(connect(server), /401|Unauthorized|authoriz/i);
    const alice = await key(server, 'acme');
    const mallory = await key(server, 'evil');
    const a = await connect(server, alice);
    const m = await connect(server, mallory);
    try {
      const run = await call(a, 'tah_run', { input: 'a secret plan' });
      assert.equal(run.isError, false);
      const sessionId = run.structuredContent.session_id;
      const record = await fetch(`${server.url}/v1/sessions/${sessionId}`, {
        headers: { authorization: `Bearer ${OPERATOR}` },
      }).then((r) => r.json());
      assert.equal(record.tenant, 'acme');

      const listed = await call(a, 'tah_sessions', {});
      assert.deepEqual(listed.structuredContent.sessions.map((s) => s.session_id), [sessionId]);
      const theirs = await call(m, 'tah_sessions', {});
      assert.deepEqual(theirs.structuredContent.sessions, []);
      for (const [name, args] of [
        ['tah_session', { session_id: sessionId }],
        ['tah_run', { session_id: sessionId, input: 'let me in' }],
        ['tah_answer', { session_id: sessionId, call_id: 'call_0_0', decision: 'allow' }],
      ]) {
        const result = await call(m, name, args);
        assert.equal(result.isError, true, name);
        assert.equal(result.content[0].text, 'session not found', name);
      }
      const runs = (await fetch(`${server.url}/v1/sessions/${sessionId}/runs`, {
        headers: { authorization: `Bearer ${OPERATOR}` },
      }).then((r) => r.json())).data;
      assert.equal(runs.length, 1);
    } finally {
      await a.close();
      await m.close();
    }
  });
});
