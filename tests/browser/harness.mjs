// What the browser tests share: a real `tah serve` (a temporary database and workspace, its
// address read from the ready line it prints), the fake OpenAI model (`tah fake-model`),
// headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core), the page's
// API through the test's own fetch, and screenshots written to target/screenshots.

import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, writeFileSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";
import { before, after } from "node:test";

const here = dirname(fileURLToPath(import.meta.url));
export const repo = resolve(here, "../..");
export const tahBin = process.env.TAH_BIN ? resolve(process.env.TAH_BIN) : join(repo, "target/debug/tah");
export const screenshots = resolve(repo, process.env.TAH_SCREENSHOTS ?? "target/screenshots");
const chromiumPath = process.env.CHROMIUM ?? "/usr/bin/chromium";

/** The README the mock model reads. */
export const README = "# Demo\n\nA small demo workspace for the web page.\n";

/** Starts `tah <args>` and resolves to {child, addr, log} once its ready line is printed. */
function launch(args, logPath) {
  return new Promise((resolveStart, rejectStart) => {
    const child = spawn(tahBin, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, RUST_LOG: "warn" } });
    const log = [];
    child.stderr.on("data", (chunk) => log.push(chunk.toString()));
    const lines = createInterface({ input: child.stdout });
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      rejectStart(new Error(`tah ${args[0]} did not start: ${log.join("")}`));
    }, 30000);
    lines.on("line", (line) => {
      try {
        const ready = JSON.parse(line);
        if (ready.listening) {
          clearTimeout(timer);
          resolveStart({ child, addr: ready.listening, log });
        }
      } catch {
        // Not the ready line.
      }
    });
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      if (logPath) writeFileSync(logPath, log.join(""));
      rejectStart(new Error(`tah ${args[0]} exited (${code ?? signal}) before it was ready: ${log.join("")}`));
    });
  });
}

/** A tah server with its own database and workspace. */
export class Server {
  /** `args`: extra `tah serve` flags. */
  static async start(args = [], { name = "tah" } = {}) {
    const dir = mkdtempSync(join(tmpdir(), "tah-browser-"));
    const workspace = join(dir, "ws");
    mkdirSync(join(workspace, "src"), { recursive: true });
    writeFileSync(join(workspace, "README.md"), README);
    writeFileSync(join(workspace, "src", "main.rs"), "fn main() {}\n");
    const server = new Server(dir, workspace, args, name);
    await server.boot("127.0.0.1:0");
    return server;
  }

  constructor(dir, workspace, args, name) {
    this.dir = dir;
    this.workspace = workspace;
    this.args = args;
    this.name = name;
  }

  async boot(listen) {
    const started = await launch(
      [
        "serve",
        "--listen", listen,
        "--database-url", `sqlite://${join(this.dir, "tah.db")}`,
        "--workspace", this.workspace,
        ...this.args,
      ],
      join(this.dir, "server.log"),
    );
    this.child = started.child;
    this.log = started.log;
    this.addr = started.addr;
    this.url = `http://${started.addr}`;
  }

  /** Stops it: SIGTERM (graceful), or SIGKILL (a crash). */
  async stop(signal = "SIGTERM") {
    if (!this.child || this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((r) => this.child.once("exit", r));
    this.child.kill(signal);
    await exited;
  }

  /**
   * Kills it (SIGKILL) and starts it again on the same address and database, so the page's
   * origin stays the same; `args` replace its extra flags if given.
   */
  async restart(args) {
    await this.stop("SIGKILL");
    if (args) this.args = args;
    let lastError;
    for (let attempt = 0; attempt < 50; attempt++) {
      try {
        await this.boot(this.addr);
        return;
      } catch (error) {
        lastError = error;
        await sleep(100);
      }
    }
    throw lastError;
  }

  /** The server's log so far (for a failure's message). */
  logText() {
    return this.log.join("");
  }

  async close() {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** One API request as a client other than the page (bearer token if given). */
  async api(method, path, body, token) {
    const headers = { accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (token) headers.authorization = `Bearer ${token}`;
    const response = await fetch(this.url + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = text;
    }
    if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
    return data;
  }

  /** Every event of a session, read as JSON pages. */
  async events(id, token) {
    const events = [];
    let after = 0;
    for (;;) {
      const page = await this.api("GET", `/v1/sessions/${id}/events?after=${after}&limit=500`, undefined, token);
      events.push(...page.data);
      if (!page.next_cursor) return events;
      after = Number(page.next_cursor);
    }
  }
}

/** `tah fake-model`: a fake OpenAI-compatible model; resolves to {url, stop()}. */
export async function fakeModel(args = []) {
  const started = await launch(["fake-model", "--listen", "127.0.0.1:0", ...args]);
  return {
    url: `http://${started.addr}/v1`,
    stop: async () => {
      const exited = new Promise((r) => started.child.once("exit", r));
      started.child.kill("SIGTERM");
      await exited;
    },
  };
}

/** Headless Chromium with the flags this machine needs (no network beyond loopback). */
export async function browser() {
  if (!existsSync(chromiumPath)) throw new Error(`no Chromium at ${chromiumPath} (apt-get install chromium)`);
  return chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
}

/**
 * Hooks on the enclosing `describe`: before its tests, a server started with `args` (or with
 * what `args()` returns then) and headless Chromium, handed to `use({ server, chromium })`;
 * after them, both closed.
 */
export function serverAndBrowser(args, use) {
  const started = {};
  before(async () => {
    started.server = await Server.start(typeof args === "function" ? args() : args);
    started.chromium = await browser();
    use(started);
  });
  after(async () => {
    await started.chromium?.close();
    await started.server?.close();
  });
}

/**
 * A new page of `server` at `width`×`height` that fails the test on any script error. Console
 * errors are kept in `page.consoleErrors` (a missing optional route logs one).
 */
export async function openPage(chromium, server, { width = 1280, height = 820, path = "/" } = {}) {
  const context = await chromium.newContext({ viewport: { width, height }, deviceScaleFactor: 1 });
  const page = await context.newPage();
  page.pageErrors = [];
  page.consoleErrors = [];
  page.on("pageerror", (error) => page.pageErrors.push(error.message));
  page.on("console", (message) => {
    if (message.type() === "error") page.consoleErrors.push(message.text());
  });
  await page.goto(server.url + path);
  await page.waitForFunction(() => document.getElementById("app").dataset.view !== "loading");
  return page;
}

/** Writes a screenshot of `page` as target/screenshots/NAME.png. */
export async function screenshot(page, name) {
  mkdirSync(screenshots, { recursive: true });
  const path = join(screenshots, `${name}.png`);
  await page.screenshot({ path });
  return path;
}

/** Creates a session through the page's own dialog and waits for it to open. */
export async function newSession(page, title) {
  await page.getByRole("button", { name: "New session" }).first().click();
  await page.getByLabel("Title").fill(title);
  await page.getByRole("button", { name: "Create" }).click();
  await page.waitForSelector("#composer:not([hidden])");
  await page.waitForFunction((t) => document.getElementById("session-title").textContent === t, title);
  return page.evaluate(() => location.hash.split("/").pop());
}

/** Types `text` in the input and sends it with Enter. */
export async function send(page, text) {
  const input = page.getByRole("textbox", { name: "Message" });
  await input.fill(text);
  await input.press("Enter");
}

/** Waits until the page shows `n` finished runs. */
export async function finishedRuns(page, n, timeout = 20000) {
  await page.waitForFunction((k) => document.querySelectorAll(".run.finished").length >= k, n, { timeout });
}

/** The seq of every row in the event inspector, in order. */
export async function inspectorSeqs(page) {
  return page.$$eval("#inspector-list li", (rows) => rows.map((r) => Number(r.dataset.seq)));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
