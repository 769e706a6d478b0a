// The page on the mock model, as a person uses it: a full turn, approvals clicked, a client
// tool's result typed in, retry-from-here, compaction, deletion, the inspector, a phone-sized
// window, and model output that tries to be HTML.

import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import {
  serverAndBrowser, openPage, screenshot, newSession, send, finishedRuns, inspectorSeqs,
} from "./harness.mjs";

/** Fails unless the element is shown (not inside a closed `details`). */
async function expectVisible(locator) {
  await locator.waitFor({ state: "visible", timeout: 2000 });
}

/** Each line of a card's diff: its sign and its text. */
function diffLines(card) {
  return card.locator(".diff-line").evaluateAll((lines) => lines.map((l) => l.textContent.replace(/\n$/, "")));
}

describe("the page on the mock model", () => {
  let server;
  let chromium;

  serverAndBrowser(["--mock-delay-ms", "15"], (started) => ({ server, chromium } = started));

  it("shows the welcome view, then a full turn: streamed reply, tool cards, usage", async () => {
    const page = await openPage(chromium, server);
    assert.equal(await page.locator("#app").getAttribute("data-view"), "welcome");
    await screenshot(page, "welcome");
    const id = await newSession(page, "Tour of the workspace");
    await send(page, "What is in this workspace?");
    // While it streams, the reply grows in place.
    await page.waitForSelector(".assistant.streaming .assistant-text:not(:empty)", { timeout: 10000 });
    await finishedRuns(page, 1);

    const cards = page.locator(".tool-card");
    assert.equal(await cards.count(), 2);
    assert.deepEqual(await page.locator(".tool-card .tool-name").allTextContents(), ["list_files", "read_file"]);
    assert.deepEqual(await page.locator(".tool-card").evaluateAll((els) => els.map((e) => e.dataset.status)), ["done", "done"]);
    // Short outputs are shown unfolded; a card's input can be opened.
    assert.deepEqual(await page.locator(".tool-card details.tool-io:has(> summary:text-is('Output'))").evaluateAll((ds) => ds.map((d) => d.open)), [true, true]);
    await expectVisible(cards.nth(1).locator(".io").nth(1));
    assert.match(await cards.nth(1).locator(".io").nth(1).textContent(), /small demo workspace/);
    await cards.nth(1).getByText("Input").click();
    await expectVisible(cards.nth(1).locator(".io").first());
    assert.match(await cards.nth(1).locator(".io").first().textContent(), /README\.md/);

    const events = await server.events(id);
    const finished = events.find((e) => e.type === "agent.finished");
    const reply = await page.locator(".assistant-text").last().textContent();
    assert.equal(reply, finished.data.text);
    assert.match(reply, /What is in this workspace\?/);
    const usage = await page.locator(".run.finished .usage").textContent();
    assert.equal(
      usage,
      `${finished.data.usage.input_tokens.toLocaleString()} in · ${finished.data.usage.output_tokens.toLocaleString()} out tokens`,
    );
    assert.equal(await page.locator("#session-state").textContent(), "completed");
    assert.deepEqual(page.pageErrors, []);
    await screenshot(page, "conversation");
    await page.context().close();
  });

  it("renders model output that looks like HTML as text, and runs none of it", async () => {
    const page = await openPage(chromium, server);
    await newSession(page, "<b>bold</b> <img src=x onerror=\"window.__xssTitle=1\">");
    const attack = `<img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> <a href="javascript:window.__xss=3">click</a>`;
    await send(page, attack);
    await finishedRuns(page, 1);
    const reply = await page.locator(".assistant-text").last().textContent();
    assert.ok(reply.includes(attack), `the reply quotes the input as text: ${reply}`);
    assert.equal(await page.locator(".bubble").last().textContent(), attack);
    const injected = await page.evaluate(() => ({
      xss: window.__xss ?? null,
      title: window.__xssTitle ?? null,
      images: document.querySelectorAll("#log img, #session-list img, #session-title img").length,
      scripts: document.querySelectorAll("#log script").length,
      links: [...document.querySelectorAll("#log a")].map((a) => a.getAttribute("href")).filter((h) => h.startsWith("javascript")),
      bold: document.querySelectorAll("#session-title b, #session-list b").length,
    }));
    assert.deepEqual(injected, { xss: null, title: null, images: 0, scripts: 0, links: [], bold: 0 });
    assert.match(await page.locator("#session-title").textContent(), /<b>bold<\/b>/);
    assert.deepEqual(page.pageErrors, []);
    await page.context().close();
  });

  it("an approval clicked: allow once runs the call, deny with a reason tells the model", async () => {
    const page = await openPage(chromium, server);
    const id = await newSession(page, "Notes");
    await send(page, "write a note about the demo");
    const card = page.locator(".tool-card[data-status=approval]");
    await card.waitFor({ timeout: 10000 });
    assert.equal(await card.locator(".tool-name").textContent(), "write_file");
    assert.equal(await page.locator("#session-state").textContent(), "waiting tool");
    assert.equal(await page.getByRole("button", { name: "Send (deny waiting)" }).count(), 1);
    await screenshot(page, "approval");
    await card.getByRole("button", { name: "Allow once" }).click();
    await finishedRuns(page, 1);
    const done = page.locator(".tool-card").filter({ hasText: "write_file" });
    assert.equal(await done.getAttribute("data-status"), "done");
    assert.match(await done.locator(".resolution").textContent(), /Allowed once/);
    assert.ok(existsSync(join(server.workspace, "notes.md")), "the allowed call wrote the file");
    // The file is the session's artifact, and its Download link serves the bytes written.
    const download = page.getByRole("link", { name: "Download" }).first();
    await download.waitFor({ timeout: 10000 });
    const href = await download.getAttribute("href");
    assert.match(href, new RegExp(`^/v1/sessions/${id}/artifacts/[0-9a-f-]+/content$`));
    const fetched = await page.evaluate(async (url) => (await fetch(url)).text(), href);
    assert.equal(fetched, "write a note about the demo\n");
    // The approval card is not shown again by a reload (the log is replayed).
    await page.reload();
    await page.waitForSelector("#log[data-caught-up=true]");
    assert.equal(await page.locator(".tool-card[data-status=approval]").count(), 0);
    assert.equal(await page.locator(".approval").count(), 0);

    // Deny, with a reason the model is told.
    await send(page, "write a note that should not be written");
    const second = page.locator(".tool-card[data-status=approval]");
    await second.waitFor({ timeout: 10000 });
    await second.getByRole("textbox", { name: "Reason for the decision" }).fill("not today");
    await second.getByRole("button", { name: "Deny" }).click();
    await finishedRuns(page, 2);
    const denied = page.locator(".tool-card[data-status=error], .tool-card[data-status=denied]").last();
    assert.match(await denied.locator(".resolution").textContent(), /Denied: not today/);
    const events = await server.events(id);
    const resolved = events.filter((e) => e.type === "tool.approval-resolved").map((e) => [e.data.decision, e.data.by, e.data.reason ?? null]);
    assert.deepEqual(resolved, [["allow", "user", null], ["deny", "user", "not today"]]);
    assert.equal(readFileSync(join(server.workspace, "notes.md"), "utf8"), "write a note about the demo\n");
    assert.deepEqual(page.pageErrors, []);
    await page.context().close();
  });

  it("a client tool's request gets a result form; the result goes to the model", async () => {
    const session = await server.api("POST", "/v1/sessions", {
      title: "Client tool",
      client_tools: [{ name: "ask_user", description: "Ask the person at the page", input_schema: { type: "object" } }],
    });
    const page = await openPage(chromium, server, { path: `/#/s/${session.id}` });
    await page.waitForSelector("#composer:not([hidden])");
    await send(page, "ask the client what colour the sky is");
    const card = page.locator(".tool-card[data-status=client]");
    await card.waitFor({ timeout: 10000 });
    assert.equal(await card.locator(".tool-name").textContent(), "ask_user");
    await card.getByRole("textbox", { name: "The tool's result" }).fill("blue, mostly");
    await screenshot(page, "client-tool");
    await card.getByRole("button", { name: "Send result" }).click();
    await finishedRuns(page, 1);
    const finished = page.locator(".tool-card").filter({ hasText: "ask_user" });
    assert.equal(await finished.getAttribute("data-status"), "done");
    assert.match(await page.locator(".assistant-text").last().textContent(), /blue, mostly/);
    await page.context().close();
  });

  it("retry from here forks before a message; compact summarises; delete asks first", async () => {
    const page = await openPage(chromium, server);
    const id = await newSession(page, "Two turns");
    await send(page, "first question");
    await finishedRuns(page, 1);
    await send(page, "second question");
    await finishedRuns(page, 2);

    // Retry from the second message: a fork with the first turn, the message in the input.
    const retry = page.getByRole("button", { name: /Retry from here/ }).nth(1);
    await retry.focus();
    await retry.press("Enter");
    await page.waitForFunction((old) => !location.hash.endsWith(old), id);
    const forkId = await page.evaluate(() => location.hash.split("/").pop());
    assert.equal(await page.getByRole("textbox", { name: "Message" }).inputValue(), "second question");
    const fork = await server.api("GET", `/v1/sessions/${forkId}`);
    assert.equal(fork.parent_id, id);
    // The copied turn is shown, from the fork's messages.
    await page.waitForSelector(".history .bubble");
    assert.deepEqual(await page.locator(".history .bubble").allTextContents(), ["first question"]);
    await page.getByRole("textbox", { name: "Message" }).press("Enter");
    await finishedRuns(page, 1);
    assert.deepEqual(await page.locator(".bubble").allTextContents(), ["first question", "second question"]);
    await screenshot(page, "fork");

    // Compact the original.
    await page.goto(`${server.url}/#/s/${id}`);
    await page.waitForSelector("#log[data-caught-up=true]");
    await page.getByRole("button", { name: "Compact" }).click();
    await page.waitForSelector(".note.info");
    assert.match(await page.locator(".note.info").textContent(), /Compacted: 2 turn\(s\) summarised/);

    // Delete asks, then the session is gone from the list.
    await page.getByRole("button", { name: "Delete" }).click();
    await page.getByRole("button", { name: "Keep it" }).click();
    assert.equal((await server.api("GET", `/v1/sessions/${id}`)).id, id);
    await page.getByRole("button", { name: "Delete" }).click();
    await page.locator("#confirm-yes").click();
    await page.waitForFunction(() => document.getElementById("app").dataset.view === "welcome");
    await page.waitForFunction((gone) => ![...document.querySelectorAll(".session-link")].some((a) => a.href.endsWith(gone)), id);
    const sessions = await server.api("GET", "/v1/sessions?limit=100");
    assert.ok(!sessions.data.some((s) => s.id === id));
    await page.context().close();
  });

  it("the event inspector shows every event once, with its data", async () => {
    const page = await openPage(chromium, server);
    const id = await newSession(page, "Inspected");
    await send(page, "inspect me");
    await finishedRuns(page, 1);
    await page.getByRole("button", { name: "Events" }).click();
    const events = await server.events(id);
    await page.waitForFunction((n) => document.querySelectorAll("#inspector-list li").length >= n, events.length);
    assert.deepEqual(await inspectorSeqs(page), events.map((e) => e.seq));
    const row = page.locator("#inspector-list li").filter({ hasText: "agent.finished" });
    await row.locator("summary").click();
    // The JSON is made when the row opens.
    await row.locator(".event-data").filter({ hasText: "run_id" }).waitFor();
    const shown = JSON.parse(await row.locator(".event-data").textContent());
    assert.deepEqual(shown, events.find((e) => e.type === "agent.finished").data);
    await screenshot(page, "inspector");
    // Hiding the text deltas leaves the rest.
    await page.getByLabel("hide text deltas").check();
    await page.waitForFunction(() => document.querySelectorAll("#inspector-list li").length > 0);
    const kept = await inspectorSeqs(page);
    assert.deepEqual(kept, events.filter((e) => !e.type.endsWith("-stream")).map((e) => e.seq));
    await page.keyboard.press("Escape");
    assert.equal(await page.locator("#inspector").isHidden(), true);
    await page.context().close();
  });

  it("draws thinking, artifacts and sub-agents from their events, and offers Files", async () => {
    const page = await openPage(chromium, server);
    const id = await newSession(page, "Newer events");
    await page.waitForSelector("#log[data-caught-up=true]");
    // This server has the artifact routes: the Files button is offered.
    await page.locator("#artifacts-toggle").waitFor({ state: "visible", timeout: 5000 });
    const artifactId = "01a00000-0000-7000-8000-000000000001";
    const childId = "01a00000-0000-7000-8000-000000000002";
    // Fed through the entry the event stream uses, with the names and fields of the contract.
    await page.evaluate(
      ({ artifactId, childId }) => {
        let seq = window.tah.feed.lastSeq;
        const at = new Date().toISOString();
        const e = (type, data) => ({ session_id: "x", seq: ++seq, type, data, created_at: at });
        window.tah.feed.onEvents([
          e("agent.started", { run_id: "r1", kind: "run" }),
          e("llm.started", { step_id: "s1" }),
          e("agent.thinking-stream", { step_id: "s1", text: "Let me think <b>hard</b>." }),
          e("agent.assistant-stream", { step_id: "s1", text: "Writing it." }),
          e("llm.completed", {
            step_id: "s1",
            message: { role: "assistant", content: "Writing it.", thinking: "Let me think <b>hard</b>.", tool_calls: [{ id: "c1", name: "task", arguments: { description: "look around", prompt: "go" } }] },
            finish_reason: "tool_calls",
            usage: { input_tokens: 10, output_tokens: 5 },
          }),
          e("tool.started", { step_id: "s1", call: { id: "c1", name: "task", arguments: { description: "look around", prompt: "go" } } }),
          e("subagent.started", { call_id: "c1", session_id: childId }),
          e("artifact.created", { artifact: { id: artifactId, path: "out/<script>.md", version: 2, size: 1234, sha256: "00", media_type: "text/markdown" } }),
          e("subagent.finished", { call_id: "c1", session_id: childId, status: "completed" }),
          e("tool.finished", { step_id: "s1", call_id: "c1", output: "child said hi", is_error: false }),
          e("agent.finished", { run_id: "r1", text: "Writing it.", finish_reason: "stop", usage: { input_tokens: 10, output_tokens: 5 } }),
        ]);
      },
      { artifactId, childId },
    );
    await finishedRuns(page, 1);
    const thinking = page.locator("details.thinking");
    assert.equal(await thinking.count(), 1);
    assert.equal(await thinking.evaluate((d) => d.open), false, "thinking is collapsed");
    assert.equal(await thinking.locator(".thinking-text").textContent(), "Let me think <b>hard</b>.");
    const link = page.getByRole("link", { name: "Download" });
    assert.equal(await link.getAttribute("href"), `/v1/sessions/${id}/artifacts/${artifactId}/content`);
    assert.equal(await link.getAttribute("download"), "<script>.md");
    assert.equal(await page.locator(".artifact-path").textContent(), "out/<script>.md");
    const card = page.locator(".tool-card").filter({ hasText: "task" });
    assert.equal(await card.locator(".subagent a").getAttribute("href"), `#/s/${childId}`);
    assert.match(await card.locator(".subagent").textContent(), /completed/);
    assert.equal(await card.getAttribute("data-status"), "done");
    assert.equal(await page.locator("#log b, #log script").count(), 0);
    assert.deepEqual(page.pageErrors, []);
    await page.context().close();
  });

  it("the header counts what a person sees, and is current in the frame a run's end is drawn", async (t) => {
    const page = await openPage(chromium, server);
    const id = await newSession(page, "Counted");
    const meta = page.locator("#session-meta");
    // A new session holds only its system prompt, which nobody sees.
    assert.match(await meta.textContent(), /· no messages yet$/);
    // What the header says in the frame the run's end is drawn, and every text it has after.
    await page.evaluate(() => {
      const log = document.getElementById("log");
      const meta = document.getElementById("session-meta");
      window.headers = [];
      new MutationObserver(() => window.headers.push({ text: meta.textContent, at: performance.now() })).observe(meta, {
        subtree: true,
        childList: true,
        characterData: true,
      });
      new MutationObserver((_, observer) => {
        if (!log.querySelector(".run.finished")) return;
        window.atRunEnd = { header: meta.textContent, at: performance.now() };
        observer.disconnect();
      }).observe(log, { subtree: true, childList: true, attributes: true });
    });
    await send(page, "What is in this workspace?");
    await finishedRuns(page, 1);
    const events = await server.events(id);
    const completed = events.filter((e) => e.type === "llm.completed");
    const messages = events.filter((e) => e.type === "user.message").length + completed.filter((e) => e.data.message.content).length;
    const calls = completed.reduce((n, e) => n + (e.data.message.tool_calls ?? []).length, 0);
    const record = await server.api("GET", `/v1/sessions/${id}`);
    const tokens = `${record.usage.input_tokens.toLocaleString()} in · ${record.usage.output_tokens.toLocaleString()} out tokens`;
    const expected = `${messages} messages · ${calls} tool calls · ${tokens}`;
    assert.equal(expected, `2 messages · 2 tool calls · ${tokens}`);
    // How long after the run's end was drawn the header said so (0: in the same frame).
    await page.waitForTimeout(1000);
    const { atRunEnd, headers } = await page.evaluate(() => ({ atRunEnd: window.atRunEnd, headers: window.headers }));
    const current = headers.find((h) => h.text.endsWith(expected));
    const lag = current ? Math.max(0, current.at - atRunEnd.at) : null;
    t.diagnostic(`header at the run's end: "${atRunEnd.header}"; current ${lag === null ? "not within 1 s" : `${Math.round(lag)} ms`} after the end was drawn`);
    assert.ok(atRunEnd.header.endsWith(expected), `at the run's end the header said "${atRunEnd.header}", not "… ${expected}"`);
    // The log replayed after a reload counts the same.
    await page.reload();
    await page.waitForSelector("#log[data-caught-up=true]");
    assert.ok((await meta.textContent()).endsWith(expected), await meta.textContent());
    await page.context().close();
  });

  it("file tools' cards show a diff: new content, then changes against what the page saw", async () => {
    const page = await openPage(chromium, server);
    const id = await newSession(page, "Diffs");
    const approved = async (text, runs) => {
      await send(page, text);
      const card = page.locator(".tool-card[data-status=approval]");
      await card.waitFor({ timeout: 10000 });
      const seen = { summary: await card.locator(".tool-diff > summary").textContent(), lines: await diffLines(card) };
      await card.getByRole("button", { name: "Allow once" }).click();
      await finishedRuns(page, runs);
      return seen;
    };
    assert.deepEqual(await approved("write a note about diffs", 1), {
      summary: "New content +1 −0",
      lines: ["+write a note about diffs"],
    });
    assert.deepEqual(await approved("write a note to `notes.md`: second version", 2), {
      summary: "Changes +1 −1",
      lines: ["-write a note about diffs", "+write a note to `notes.md`: second version"],
    });
    // The page knows the file: the edit is shown in its lines.
    const edit = await approved("edit the note: replace `second` with `third`", 3);
    assert.deepEqual(edit, {
      summary: "Changes +1 −1",
      lines: ["-write a note to `notes.md`: second version", "+write a note to `notes.md`: third version"],
    });
    await screenshot(page, "diff");
    // And the edit is applied to what the page knows of the file.
    assert.deepEqual((await approved("write a note to `notes.md`: fourth version", 4)).lines, [
      "-write a note to `notes.md`: third version",
      "+write a note to `notes.md`: fourth version",
    ]);
    assert.equal(readFileSync(join(server.workspace, "notes.md"), "utf8"), "write a note to `notes.md`: fourth version\n");
    // A reload draws the same diffs from the log.
    await page.reload();
    await page.waitForSelector("#log[data-caught-up=true]");
    const cards = page.locator(".tool-card").filter({ has: page.locator(".tool-diff") });
    assert.equal(await cards.count(), 4);
    assert.deepEqual(await diffLines(cards.nth(2)), edit.lines);
    assert.deepEqual(await diffLines(cards.nth(3)), ["-write a note to `notes.md`: third version", "+write a note to `notes.md`: fourth version"]);
    assert.equal((await server.events(id)).filter((e) => e.type === "tool.finished" && !e.data.is_error).length, 4);
    assert.deepEqual(page.pageErrors, []);
    await page.context().close();
  });

  it("a tool's output is unfolded when short and folded when long; diffs fold long unchanged runs", async () => {
    const page = await openPage(chromium, server);
    await newSession(page, "Outputs");
    await page.waitForSelector("#log[data-caught-up=true]");
    const long = Array.from({ length: 60 }, (_, i) => `line ${i}`).join("\n");
    const edited = long.replace("line 30", "line thirty");
    await page.evaluate(({ long, edited }) => {
      let seq = window.tah.feed.lastSeq;
      const at = new Date().toISOString();
      const e = (type, data) => ({ session_id: "x", seq: ++seq, type, data, created_at: at });
      const call = (id, name, args) => ({ id, name, arguments: args });
      const step = (id, calls) =>
        e("llm.completed", { step_id: id, message: { role: "assistant", content: "", tool_calls: calls }, finish_reason: "tool_calls", usage: { input_tokens: 1, output_tokens: 1 } });
      window.tah.feed.onEvents([
        e("agent.started", { run_id: "r", kind: "run" }),
        e("llm.started", { step_id: "s1" }),
        step("s1", [call("short", "read_file", { path: "a.txt" }), call("long", "read_file", { path: "b.txt" }), call("w1", "write_file", { path: "big.txt", content: long })]),
        e("tool.finished", { step_id: "s1", call_id: "short", output: "two\nlines", is_error: false }),
        e("tool.finished", { step_id: "s1", call_id: "long", output: long, is_error: false }),
        e("tool.finished", { step_id: "s1", call_id: "w1", output: "wrote", is_error: false }),
        e("llm.started", { step_id: "s2" }),
        step("s2", [call("w2", "write_file", { path: "big.txt", content: edited }), call("e1", "edit_file", { path: "unseen.txt", old_string: "a\nb", new_string: "a\nc" })]),
        e("tool.finished", { step_id: "s2", call_id: "w2", output: "wrote", is_error: false }),
        e("tool.finished", { step_id: "s2", call_id: "e1", output: "edited", is_error: false }),
        e("agent.finished", { run_id: "r", text: "", finish_reason: "stop", usage: { input_tokens: 2, output_tokens: 2 } }),
      ]);
    }, { long, edited });
    await finishedRuns(page, 1);
    const output = (id) => page.locator(`.tool-card[data-call-id="${id}"] details.tool-io:has(> summary:text-is('Output'))`);
    assert.equal(await output("short").evaluate((d) => d.open), true);
    assert.equal(await output("long").evaluate((d) => d.open), false);
    const second = page.locator('.tool-card[data-call-id="w2"]');
    assert.equal(await second.locator(".tool-diff > summary").textContent(), "Changes +1 −1");
    assert.deepEqual(await diffLines(second), [
      "⋯ 27 unchanged lines", " line 27", " line 28", " line 29",
      "-line 30", "+line thirty",
      " line 31", " line 32", " line 33", "⋯ 26 unchanged lines",
    ]);
    // An edit of a file the page never saw: its two strings.
    assert.deepEqual(await diffLines(page.locator('.tool-card[data-call-id="e1"]')), [" a", "-b", "+c"]);
    await screenshot(page, "outputs");
    await page.context().close();
  });

  it("works at phone width: the session list slides in, the conversation fits", async () => {
    const page = await openPage(chromium, server, { width: 390, height: 844 });
    const sessions = await server.api("GET", "/v1/sessions?limit=100");
    const target = sessions.data.find((s) => s.title === "Tour of the workspace") ?? sessions.data[0];
    await page.getByRole("button", { name: "Show the session list" }).click();
    await page.waitForTimeout(300);
    await screenshot(page, "phone-sessions");
    await page.locator(`.session-link[href$="${target.id}"]`).click();
    await page.waitForSelector("#log[data-caught-up=true]");
    // Opening a session closes the list; the screenshot waits for it to have slid away.
    await page.locator("#sidebar").waitFor({ state: "hidden" });
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `the page is ${overflow}px wider than the window`);
    await screenshot(page, "phone-conversation");
    await page.context().close();
  });
});
