// `tah acp` driven by the Agent Client Protocol SDK's own client (`client()` connected over
// `ndJsonStream` to the bridge's stdio), pinned: initialize, new sessions, prompts with their
// streamed updates and stop reasons, permissions allowed and denied, cancel, load replaying
// the history, bad input, and a token.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Readable, Writable } from 'node:stream';
import { after, describe, test } from 'node:test';

import * as acp from '@agentclientprotocol/sdk';

import { suiteServer, until } from './support/server.mjs';

const bridges = [];
after(() => {
  for (const child of bridges) child.kill('SIGTERM');
});

function spawnBridge(server, { args = [], env = {} } = {}) {
  const child = spawn(process.env.TAH_BIN, ['acp', '--server', server.url, ...args], {
    stdio: ['pipe', 'pipe', 'pipe'],
    env: { ...process.env, RUST_LOG: 'warn', TAH_TOKEN: '', ...env },
  });
  bridges.push(child);
  return child;
}

/**
 * A client connected to a new bridge: the updates it was sent, and the permission requests,
 * each answered with `answer(params)`.
 */
async function connect(server, options = {}) {
  const child = spawnBridge(server, options);
  const updates = [];
  const permissions = [];
  const state = { answer: () => ({ outcome: { outcome: 'selected', optionId: 'allow' } }) };
  const app = acp
    .client({ name: 'tah-protocol-test' })
    .onNotification(acp.methods.client.session.update, ({ params }) => void updates.push(params))
    .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
      permissions.push(params);
      return state.answer(params);
    });
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  const connection = app.connect(stream);
  const agent = connection.agent;
  const init = await agent.request(acp.methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: {},
    clientInfo: { name: 'tah-protocol-test', version: '1.0.0' },
  });
  return { child, agent, connection, init, updates, permissions, state };
}

function texts(updates, sessionId, kind) {
  return updates
    .filter((u) => u.sessionId === sessionId && u.update.sessionUpdate === kind)
    .map((u) => u.update.content.text);
}

async function newSession(agent, cwd) {
  const { sessionId } = await agent.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });
  return sessionId;
}

async function prompt(agent, sessionId, text) {
  return agent.request(acp.methods.agent.session.prompt, { sessionId, prompt: [{ type: 'text', text }] });
}

describe('tah acp', () => {
  const server = suiteServer();

  test('initialize, a new session and a prompt whose text, reasoning and tools stream', async () => {
    const c = await connect(server);
    try {
      assert.equal(c.init.protocolVersion, 1);
      assert.equal(c.init.agentCapabilities.loadSession, true);
      assert.equal(c.init.agentInfo.name, 'tah');
      const sessionId = await newSession(c.agent, server.workspace);
      const record = await server.session(sessionId);
      assert.equal(record.metadata.acp.cwd, server.workspace);

      const response = await prompt(c.agent, sessionId, 'think about this workspace');
      assert.equal(response.stopReason, 'end_turn');
      const events = await server.events(sessionId);
      const finished = events.find((e) => e.type === 'agent.finished');
      const streamed = events.filter((e) => e.type === 'agent.assistant-stream').map((e) => e.data.text).join('');
      assert.equal(texts(c.updates, sessionId, 'agent_message_chunk').join(''), streamed);
      assert.ok(streamed.endsWith(finished.data.text));
      const thought = events.filter((e) => e.type === 'agent.thinking-stream').map((e) => e.data.text).join('');
      assert.ok(thought.length > 0);
      assert.equal(texts(c.updates, sessionId, 'agent_thought_chunk').join(''), thought);

      const calls = c.updates.filter((u) => u.update.sessionUpdate === 'tool_call').map((u) => u.update);
      const started = events.filter((e) => e.type === 'tool.started').map((e) => e.data.call);
      assert.deepEqual(calls.map((t) => [t.toolCallId, t.title, t.name, t.kind]), started.map((s) => [s.id, s.name, s.name, 'read']));
      const done = c.updates.filter((u) => u.update.sessionUpdate === 'tool_call_update' && u.update.status === 'completed');
      assert.deepEqual(done.map((u) => u.update.toolCallId), started.map((s) => s.id));
      assert.deepEqual(c.permissions, []);
    } finally {
      c.connection.close();
    }
  });

  test('an approval is a permission request: allowed it runs, denied it does not', async () => {
    const c = await connect(server);
    try {
      const sessionId = await newSession(c.agent, server.workspace);
      const allowed = await prompt(c.agent, sessionId, 'write a note about the editors');
      assert.equal(allowed.stopReason, 'end_turn');
      assert.equal(c.permissions.length, 1);
      const [asked] = c.permissions;
      assert.equal(asked.sessionId, sessionId);
      assert.equal(asked.toolCall.title, 'write_file');
      assert.equal(asked.toolCall.kind, 'edit');
      assert.deepEqual(asked.options.map((o) => o.kind), ['allow_once', 'allow_always', 'reject_once']);
      assert.ok(existsSync(join(server.workspace, 'notes.md')));

      c.state.answer = () => ({ outcome: { outcome: 'selected', optionId: 'deny' } });
      const denied = await prompt(c.agent, sessionId, 'write a note to `refused.md`');
      assert.equal(denied.stopReason, 'end_turn');
      assert.equal(c.permissions.length, 2);
      assert.ok(!existsSync(join(server.workspace, 'refused.md')));
      const deniedCall = c.permissions[1].toolCall.toolCallId;
      const failed = c.updates.filter((u) => u.update.toolCallId === deniedCall && u.update.status === 'failed');
      assert.equal(failed.length, 1);
      const resolved = (await server.events(sessionId)).filter((e) => e.type === 'tool.approval-resolved');
      assert.deepEqual(resolved.map((e) => e.data.decision), ['allow', 'deny']);
    } finally {
      c.connection.close();
    }
  });

  test('session/load replays the history as updates', async () => {
    const first = await connect(server);
    let sessionId;
    let finished;
    try {
      sessionId = await newSession(first.agent, server.workspace);
      await prompt(first.agent, sessionId, 'hello from the editor');
      finished = (await server.events(sessionId)).find((e) => e.type === 'agent.finished').data.text;
    } finally {
      first.connection.close();
    }
    const again = await connect(server);
    try {
      const loaded = await again.agent.request(acp.methods.agent.session.load, { sessionId, cwd: server.workspace, mcpServers: [] });
      assert.deepEqual(loaded, {});
      assert.deepEqual(texts(again.updates, sessionId, 'user_message_chunk'), ['hello from the editor']);
      assert.equal(texts(again.updates, sessionId, 'agent_message_chunk').at(-1), finished);
      const kinds = again.updates.map((u) => u.update.sessionUpdate);
      assert.ok(kinds.includes('tool_call') && kinds.includes('tool_call_update'));
      // The session goes on from where it was.
      const next = await prompt(again.agent, sessionId, 'and once more');
      assert.equal(next.stopReason, 'end_turn');
    } finally {
      again.connection.close();
    }
  });

  test('bad params and unknown methods are JSON-RPC errors; the bridge goes on', async () => {
    const c = await connect(server);
    try {
      const cases = [
        ['unknown/method', {}, -32601],
        [acp.methods.agent.session.setMode, { sessionId: 'x', modeId: 'y' }, -32601],
        [acp.methods.agent.session.new, { cwd: 'relative', mcpServers: [] }, -32602],
        [acp.methods.agent.session.new, { cwd: server.workspace, mcpServers: [], additionalDirectories: ['/tmp'] }, -32602],
        [acp.methods.agent.session.new, { cwd: server.workspace, mcpServers: [{ name: 'x', command: 'y', args: [], env: [] }] }, -32602],
        [acp.methods.agent.session.prompt, { sessionId: '00000000-0000-4000-8000-000000000000', prompt: [{ type: 'text', text: 'hi' }] }, -32002],
        [acp.methods.agent.session.load, { sessionId: '00000000-0000-4000-8000-000000000000', cwd: server.workspace, mcpServers: [] }, -32002],
      ];
      for (const [method, params, code] of cases) {
        await assert.rejects(c.agent.request(method, params), (error) => {
          assert.equal(error.code, code, `${method} ${JSON.stringify(params)}: ${error.message}`);
          return true;
        });
      }
      const sessionId = await newSession(c.agent, server.workspace);
      await assert.rejects(
        c.agent.request(acp.methods.agent.session.prompt, { sessionId, prompt: [{ type: 'image', data: '', mimeType: 'image/png' }] }),
        (error) => error.code === -32602,
      );
      assert.equal((await prompt(c.agent, sessionId, 'still here?')).stopReason, 'end_turn');
    } finally {
      c.connection.close();
    }
  });

  test('lines that are not JSON-RPC requests are answered with errors, never a crash', async () => {
    const child = spawnBridge(server);
    const lines = createInterface({ input: child.stdout });
    const answers = [];
    lines.on('line', (line) => answers.push(JSON.parse(line)));
    child.stdin.write('not json\n');
    child.stdin.write('[1, 2]\n');
    child.stdin.write('{"jsonrpc":"2.0","id":7,"method":42}\n');
    child.stdin.write('{"jsonrpc":"2.0","id":8,"method":"initialize","params":{"protocolVersion":"one"}}\n');
    child.stdin.write('{"jsonrpc":"2.0","id":9,"method":"initialize","params":{"protocolVersion":1}}\n');
    await until(() => answers.length === 5, 'five answers');
    const byId = (id) => answers.find((a) => a.id === id);
    assert.deepEqual(answers.filter((a) => a.id === null).map((a) => a.error.code).sort(), [-32700, -32600].sort());
    assert.equal(byId(7).error.code, -32600);
    assert.equal(byId(8).error.code, -32602);
    assert.equal(byId(9).result.protocolVersion, 1);
    assert.equal(child.exitCode, null);
    child.stdin.end();
    await new Promise((resolve) => child.once('exit', resolve));
    assert.equal(child.exitCode, 0);
  });
});

describe('tah acp: cancel', () => {
  const server = suiteServer({ mockDelayMs: 150 });

  test('session/cancel ends the prompt with stopReason cancelled', async () => {
    const c = await connect(server);
    try {
      const sessionId = await newSession(c.agent, server.workspace);
      const pending = prompt(c.agent, sessionId, 'take your time');
      await until(() => c.updates.some((u) => u.sessionId === sessionId), 'a first update');
      await c.agent.notify(acp.methods.agent.session.cancel, { sessionId });
      const response = await pending;
      assert.equal(response.stopReason, 'cancelled');
      const events = await server.events(sessionId);
      assert.ok(events.some((e) => e.type === 'agent.cancelled'));
    } finally {
      c.connection.close();
    }
  });
});

describe('tah acp with a token', () => {
  const token = 'operator-token-0123456789';
  const server = suiteServer({ extraArgs: ['--api-token', token] });

  test('without the token the server refuses; with TAH_TOKEN it works', async () => {
    const anonymous = await connect(server);
    try {
      await assert.rejects(
        anonymous.agent.request(acp.methods.agent.session.new, { cwd: server.workspace, mcpServers: [] }),
        (error) => error.code === -32000,
      );
    } finally {
      anonymous.connection.close();
    }
    const c = await connect(server, { env: { TAH_TOKEN: token } });
    try {
      const sessionId = await newSession(c.agent, server.workspace);
      assert.equal((await prompt(c.agent, sessionId, 'hello')).stopReason, 'end_turn');
    } finally {
      c.connection.close();
    }
  });
});
