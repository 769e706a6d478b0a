// The manual's examples (docs/src/protocols.md), run as they are written
// (tests/protocols/examples/): the useChat page bundled with esbuild and rendered with React
// into a DOM (happy-dom), clicked through a turn and an approval; the AG-UI client run as a
// program, answering its prompts on stdin.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { after, before, describe, test } from 'node:test';

import { build } from 'esbuild';
import { GlobalRegistrator } from '@happy-dom/global-registrator';

import { lastTurn, startTah, suiteServer, until } from './support/server.mjs';

const examples = join(dirname(fileURLToPath(import.meta.url)), 'examples');

/** The text the assistant wrote in the session's last turn. */
async function lastTurnText(server, sessionId) {
  return lastTurn(await server.messages(sessionId))
    .filter((m) => m.role === 'assistant')
    .map((m) => m.content)
    .join('');
}

test('the manual\'s page shows the examples exactly as they are run here', () => {
  const page = readFileSync(join(examples, '..', '..', '..', 'docs', 'src', 'protocols.md'), 'utf8');
  for (const [file, fence] of [['chat-page.jsx', 'jsx'], ['ag-ui-client.mjs', 'js']]) {
    const code = readFileSync(join(examples, file), 'utf8');
    assert.ok(page.includes('```' + fence + '\n' + code + '```'), `${file} is quoted whole`);
  }
});

describe('the AG-UI client example', () => {
  const server = suiteServer();

  /** Runs the example, answering each prompt it writes on stderr with the next answer. */
  function runExample(sessionId, question, answers) {
    const child = spawn(process.execPath, [join(examples, 'ag-ui-client.mjs'), server.url, sessionId, question], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let prompts = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => {
      prompts += d;
      if (answers.length && / $/.test(prompts)) {
        child.stdin.write(`${answers.shift()}\n`);
        prompts = '';
      }
    });
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill();
        reject(new Error(`the example did not finish; it wrote ${stdout} / ${prompts}`));
      }, 20000);
      child.on('exit', (code) => {
        clearTimeout(timer);
        child.stdin.end();
        code === 0 ? resolve(stdout) : reject(new Error(`the example exited ${code}: ${prompts}`));
      });
    });
  }

  test('it answers an approval and prints what tah wrote', async () => {
    const sessionId = await server.createSession();
    const printed = await runExample(sessionId, 'write a note from the example', ['y']);
    assert.equal(printed.trim(), await lastTurnText(server, sessionId));
    assert.match(printed, /write_file answered: created notes\.md/);
  });

  test('it runs its own tool when the model calls it', async () => {
    const sessionId = await server.createSession();
    const printed = await runExample(sessionId, 'ask the client for a colour', ['purple']);
    assert.equal(printed.trim(), await lastTurnText(server, sessionId));
    assert.match(printed, /ask_user answered: purple/);
  });
});

describe('the useChat page example', () => {
  let server;
  let dir;
  let page;
  before(async () => {
    server = await startTah();
    dir = mkdtempSync(join(tmpdir(), 'tah-page-'));
    const outfile = join(dir, 'chat-page.mjs');
    await build({
      entryPoints: [join(examples, 'chat-page.jsx')],
      bundle: true,
      format: 'esm',
      platform: 'browser',
      jsx: 'automatic',
      outfile,
      logLevel: 'error',
      define: { 'process.env.NODE_ENV': '"development"' },
    });
    // A DOM for React; the network stays Node's own (happy-dom's fetch would add CORS rules
    // of a page served from elsewhere).
    const names = ['fetch', 'Request', 'Response', 'Headers', 'ReadableStream', 'WritableStream',
      'TransformStream', 'TextDecoderStream', 'TextEncoderStream', 'TextDecoder', 'TextEncoder',
      'AbortController', 'AbortSignal'];
    const kept = Object.fromEntries(names.map((name) => [name, globalThis[name]]));
    GlobalRegistrator.register({ url: server.url });
    Object.assign(globalThis, kept);
    page = await import(pathToFileURL(outfile).href);
  });
  after(async () => {
    await GlobalRegistrator.unregister();
    await server?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  function type(text) {
    const input = document.querySelector('input');
    const setValue = Object.getOwnPropertyDescriptor(window.HTMLInputElement.prototype, 'value').set;
    setValue.call(input, text);
    input.dispatchEvent(new window.Event('input', { bubbles: true }));
    document.querySelector('form').dispatchEvent(new window.Event('submit', { bubbles: true, cancelable: true }));
  }

  const assistantText = () =>
    [...document.querySelectorAll('section.assistant p')].map((p) => p.textContent).join('');
  const ready = () => !document.querySelector('input').disabled;

  /** What the page shows: each message's role, its texts, and its tool parts' states. */
  const shown = () =>
    [...document.querySelectorAll('section')].map((s) => [
      s.className,
      [...s.querySelectorAll('p')].map((p) => p.textContent).join(''),
      [...s.querySelectorAll('.tool')].map((t) => t.dataset.state).join(' '),
    ]);

  /** The page opened on the session, in a fresh root (what a reload does); `close()` ends it. */
  async function open(sessionId) {
    const element = document.createElement('div');
    document.body.appendChild(element);
    const root = page.mount(element, { server: server.url, sessionId });
    await until(() => document.querySelector('input') && ready(), 'the page');
    return {
      async close() {
        root.unmount();
        element.remove();
        // React finishes the work the unmount scheduled before the DOM may go away.
        await new Promise((resolve) => setTimeout(resolve, 20));
      },
    };
  }

  test('a turn, then an approval clicked on the page', async () => {
    const sessionId = await server.createSession();
    const root = await open(sessionId);

    type('what is in this workspace?');
    await until(() => ready() && assistantText().length > 0 && document.querySelectorAll('section').length === 2, 'the answer')
      .catch((e) => {
        throw new Error(`${e.message}; the page shows: ${document.body.innerHTML}`);
      });
    await server.waitForState(sessionId, 'completed');
    assert.equal(assistantText(), await lastTurnText(server, sessionId));
    assert.deepEqual(
      [...document.querySelectorAll('.tool')].map((t) => t.dataset.state),
      ['output-available', 'output-available'],
    );

    type('write a note from the page');
    await until(() => document.querySelector('.tool[data-state="approval-requested"] button'), 'the approval');
    const [allow] = document.querySelectorAll('.tool[data-state="approval-requested"] button');
    assert.equal(allow.textContent, 'Allow');
    allow.click();
    await until(() => ready() && /write_file answered/.test(assistantText()), 'the rest of the run');
    await server.waitForState(sessionId, 'completed');
    const sections = document.querySelectorAll('section.assistant');
    const last = [...sections[sections.length - 1].querySelectorAll('p')];
    assert.equal(last.map((p) => p.textContent).join(''), await lastTurnText(server, sessionId));
    assert.equal(document.querySelector('[role="alert"]'), null);
    await root.close();
  });

  test('a reload shows the chat as it was, and an approval still waiting can be answered', async () => {
    const sessionId = await server.createSession();
    let root = await open(sessionId);
    type('what is in this workspace?');
    await until(() => ready() && document.querySelectorAll('section').length === 2 && assistantText().length > 0, 'the answer');
    await server.waitForState(sessionId, 'completed');
    const before = shown();

    await root.close();
    root = await open(sessionId);
    await until(() => document.querySelectorAll('section').length === 2, 'the history');
    assert.deepEqual(shown(), before);

    type('write a note from the page');
    await until(() => document.querySelector('.tool[data-state="approval-requested"] button'), 'the approval');
    await server.waitForState(sessionId, 'waiting_tool');
    await root.close();
    root = await open(sessionId);
    await until(() => document.querySelector('.tool[data-state="approval-requested"] button'), 'the approval after a reload');
    assert.deepEqual(shown().slice(0, 2), before);
    assert.equal(document.querySelectorAll('section').length, 4, 'nothing shows twice');
    document.querySelector('.tool[data-state="approval-requested"] button').click();
    await until(() => ready() && /write_file answered/.test(assistantText()), 'the rest of the run');
    await server.waitForState(sessionId, 'completed');
    assert.equal(document.querySelectorAll('section').length, 4);
    assert.equal(document.querySelector('[role="alert"]'), null);
    await root.close();
  });
});
