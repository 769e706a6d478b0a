// A real tah server for the protocol tests: `tah serve` on port 0 with a temporary SQLite
// database and workspace (the mock model, or the fake OpenAI-compatible model that
// `tah fake-model` serves), its address read from the ready line it writes to stdout; and the
// few calls of tah's own API the tests use to read tah's record of a run.

import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before } from 'node:test';

const TAH = process.env.TAH_BIN;
if (!TAH) throw new Error('TAH_BIN must name the tah binary (scripts/protocol-clients.sh sets it)');

/** Starts `tah ARGS…` and resolves with the child and its address once it is ready. */
function launch(args, env = {}) {
  const child = spawn(TAH, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RUST_LOG: 'warn', ...env },
  });
  let log = '';
  child.stderr.on('data', (chunk) => {
    log += chunk;
  });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`tah ${args[0]} wrote no ready line:\n${log}`)), 20000);
    child.once('exit', (code) => reject(new Error(`tah ${args[0]} exited (${code}) before it was ready:\n${log}`)));
    createInterface({ input: child.stdout }).on('line', (line) => {
      try {
        const { listening } = JSON.parse(line);
        clearTimeout(timer);
        resolve({ child, url: `http://${listening}`, log: () => log });
      } catch {
        // Not the ready line.
      }
    });
  });
}

async function stop(child) {
  if (child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  await exited;
}

/**
 * A tah server. `model`: 'mock' (default) or 'fake' (the fake OpenAI model: one `list_files`
 * call per turn, then `pieces` text chunks).
 */
export async function startTah({ model = 'mock', mockDelayMs = 0, pieces = 5, extraArgs = [] } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'tah-protocols-'));
  const workspace = join(dir, 'ws');
  mkdirSync(join(workspace, 'src'), { recursive: true });
  writeFileSync(join(workspace, 'README.md'), '# Demo\n\nA small workspace for the protocol clients.\n');
  writeFileSync(join(workspace, 'src', 'main.rs'), 'fn main() {}\n');
  const children = [];
  // With TAH_PROTOCOLS_PG_URL (a PostgreSQL server), each server gets a database of its own,
  // which tah creates.
  const pg = process.env.TAH_PROTOCOLS_PG_URL;
  const database = pg
    ? `${pg.replace(/\/[^/]*$/, '')}/tah_protocols_${randomUUID().replaceAll('-', '')}`
    : `sqlite://${join(dir, 'data.db')}`;
  let args = [
    'serve',
    '--listen', '127.0.0.1:0',
    '--database-url', database,
    '--workspace', workspace,
    ...extraArgs,
  ];
  let env = {};
  if (model === 'fake') {
    const fake = await launch(['fake-model', '--listen', '127.0.0.1:0', '--pieces', String(pieces)]);
    children.push(fake.child);
    args = [...args, '--provider', 'openai', '--base-url', `${fake.url}/v1`, '--model', 'fake'];
    env = { OPENAI_API_KEY: 'sk-fake' };
  } else {
    args = [...args, '--provider', 'mock', '--mock-delay-ms', String(mockDelayMs)];
  }
  const tah = await launch(args, env);
  children.push(tah.child);
  const url = tah.url;
  return {
    url,
    workspace,
    /** The server's database URL (for `tah keys create --database-url …`). */
    database,
    log: tah.log,
    async close() {
      for (const child of children.reverse()) await stop(child);
      rmSync(dir, { recursive: true, force: true });
    },
    /** tah's own API, as JSON. */
    async api(method, path, body) {
      const response = await fetch(url + path, {
        method,
        headers: body === undefined ? {} : { 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await response.text();
      return { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : null };
    },
    async createSession(options = {}) {
      const { status, body } = await this.api('POST', '/v1/sessions', options);
      if (status !== 201) throw new Error(`creating a session: ${status} ${JSON.stringify(body)}`);
      return body.id;
    },
    /** The session's model-visible history, as tah records it. */
    async messages(sessionId) {
      const { body } = await this.api('GET', `/v1/sessions/${sessionId}/messages?limit=500`);
      return body.data;
    },
    /** The session's event log. */
    async events(sessionId) {
      const all = [];
      for (;;) {
        const after = all.length ? all[all.length - 1].seq : 0;
        const { body } = await this.api('GET', `/v1/sessions/${sessionId}/events?limit=500&after=${after}`);
        all.push(...body.data);
        if (body.data.length < 500) return all;
      }
    },
    async session(sessionId) {
      return (await this.api('GET', `/v1/sessions/${sessionId}`)).body;
    },
    /** Waits until the session's state is `state`. */
    async waitForState(sessionId, states, timeoutMs = 10000) {
      const wanted = [].concat(states);
      const until = Date.now() + timeoutMs;
      for (;;) {
        const session = await this.session(sessionId);
        if (wanted.includes(session.state)) return session;
        if (Date.now() > until) throw new Error(`session ${sessionId} is ${session.state}, not ${wanted}`);
        await new Promise((r) => setTimeout(r, 20));
      }
    },
  };
}

/**
 * The tah server (`startTah(options)`) of the enclosing `describe`: started before its tests,
 * closed after them. What is returned stands for that server once it has started.
 */
export function suiteServer(options) {
  let server;
  before(async () => {
    server = await startTah(options);
  });
  after(async () => {
    await server?.close();
  });
  return new Proxy(
    {},
    {
      get(_, name) {
        const value = server[name];
        return typeof value === 'function' ? value.bind(server) : value;
      },
    },
  );
}

/** The history messages of the session's last turn (from its last user message on). */
export function lastTurn(messages) {
  const at = messages.map((m) => m.role).lastIndexOf('user');
  return messages.slice(at);
}

/** Waits for `check()` to be true. */
export async function until(check, what, timeoutMs = 10000) {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
