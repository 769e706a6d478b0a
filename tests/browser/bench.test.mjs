// Figures, not assertions on time: the page's size over the wire, how long it takes to show
// something, and how many events a second it draws without falling behind. They are printed
// (as test diagnostics) and written to target/screenshots/figures.json. What is asserted is
// behaviour: every event fed is drawn, and the text drawn is the text fed.
//
// The rendering rate feeds synthetic events through the same entry the event stream uses
// (the open session's `onEvents`: conversation, inspector and state together), in chunks
// every 10 ms as a stream delivers them, at rising rates; a rate is kept up with when no more
// than 100 ms of events ever wait and the queue is empty within 50 ms of the last chunk. The end-to-end figure sends one long input
// to the mock model (which echoes it a word at a time) and times the page until the reply is
// drawn.

import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { serverAndBrowser, openPage, newSession, send, finishedRuns, screenshots } from "./harness.mjs";

const figures = {};

describe("figures", () => {
  let server;
  let chromium;

  serverAndBrowser([], (started) => ({ server, chromium } = started));

  after(() => {
    mkdirSync(screenshots, { recursive: true });
    writeFileSync(join(screenshots, "figures.json"), `${JSON.stringify(figures, null, 2)}\n`);
  });

  it("the page's size over the wire and its time to first render", async (t) => {
    // A few sessions so that the list has something to draw.
    for (let i = 0; i < 5; i++) await server.api("POST", "/v1/sessions", { title: `Session ${i}` });
    const loads = [];
    for (let i = 0; i < 5; i++) {
      const page = await openPage(chromium, server);
      await page.waitForFunction(() => performance.getEntriesByName("tah:ready").length > 0);
      loads.push(
        await page.evaluate(() => {
          const nav = performance.getEntriesByType("navigation")[0];
          const files = [nav, ...performance.getEntriesByType("resource").filter((r) => !r.name.includes("/v1/"))];
          const paint = performance.getEntriesByName("first-contentful-paint")[0];
          return {
            files: files.length,
            wire: files.reduce((n, r) => n + r.encodedBodySize, 0),
            raw: files.reduce((n, r) => n + r.decodedBodySize, 0),
            fcp: paint?.startTime ?? null,
            ready: performance.getEntriesByName("tah:ready")[0].startTime,
          };
        }),
      );
      await page.context().close();
    }
    const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    figures.page = {
      files: loads[0].files,
      bytes_over_the_wire_gzip: loads[0].wire,
      bytes_uncompressed: loads[0].raw,
      first_contentful_paint_ms: Math.round(median(loads.map((l) => l.fcp))),
      session_list_drawn_ms: Math.round(median(loads.map((l) => l.ready))),
    };
    assert.ok(loads[0].wire > 0 && loads[0].wire < loads[0].raw, JSON.stringify(loads[0]));
    t.diagnostic(`page: ${JSON.stringify(figures.page)}`);
  });

  it("time to show a long session's whole log", async (t) => {
    const page = await openPage(chromium, server);
    const id = await newSession(page, "Long log");
    for (let i = 0; i < 5; i++) {
      await send(page, `turn ${i} ` + "lorem ipsum ".repeat(60));
      await finishedRuns(page, i + 1);
    }
    const events = await server.events(id);
    const times = [];
    for (let i = 0; i < 3; i++) {
      await page.reload();
      await page.waitForSelector("#log[data-caught-up=true]");
      times.push(await page.evaluate(() => performance.getEntriesByName("tah:caught-up")[0].startTime));
    }
    assert.equal(await page.locator(".run.finished").count(), 5);
    figures.long_session = { events: events.length, caught_up_ms: Math.round(times.sort((a, b) => a - b)[1]) };
    t.diagnostic(`long session: ${JSON.stringify(figures.long_session)}`);
    await page.context().close();
  });

  it("events a second drawn without falling behind", async (t) => {
    const page = await openPage(chromium, server);
    await newSession(page, "Rendering rate");
    await page.waitForSelector("#log[data-caught-up=true]");
    const rates = [5000, 10000, 20000, 50000, 100000];
    const results = await page.evaluate(async (rates) => {
      const feed = window.tah.feed;
      const conversation = window.tah.conversation;
      let seq = feed.lastSeq;
      const at = new Date().toISOString();
      const event = (type, data) => ({ session_id: "bench", seq: ++seq, type, data, created_at: at });
      const out = [];
      let n = 0;
      for (const rate of rates) {
        const step = `step-${rate}`;
        let fed = "";
        feed.onEvents([event("agent.started", { run_id: `run-${rate}`, kind: "run" }), event("llm.started", { step_id: step })]);
        const started = performance.now();
        let maxQueue = 0;
        let count = 0;
        while (performance.now() - started < 1000) {
          // As many events as are due by now at this rate, however long the last tick took.
          const due = Math.floor((rate * (performance.now() - started)) / 1000) - count;
          const batch = [];
          for (let i = 0; i < due; i++) {
            n += 1;
            if (n % 200 === 0) {
              batch.push(event("tool.started", { step_id: step, call: { id: `c${n}`, name: "read_file", arguments: { path: `f${n}.txt` } } }));
              batch.push(event("tool.finished", { step_id: step, call_id: `c${n}`, output: "ok", is_error: false }));
            } else {
              const text = `w${n} `;
              fed += text;
              batch.push(event("agent.assistant-stream", { step_id: step, text }));
            }
          }
          count += due;
          if (batch.length) feed.onEvents(batch);
          maxQueue = Math.max(maxQueue, conversation.queue.length);
          await new Promise((r) => setTimeout(r, 10));
        }
        const lastFed = performance.now();
        while (conversation.queue.length) await new Promise((r) => requestAnimationFrame(r));
        const lag = performance.now() - lastFed;
        const elapsed = (lastFed - started) / 1000;
        const block = conversation.blocks.get(step);
        out.push({
          offered_per_s: rate,
          fed_per_s: Math.round(count / elapsed),
          lag_ms: Math.round(lag),
          max_queue: maxQueue,
          text_ok: block.source === fed,
        });
        feed.onEvents([event("agent.finished", { run_id: `run-${rate}`, text: "", finish_reason: "stop", usage: { input_tokens: 0, output_tokens: 0 } })]);
        while (conversation.queue.length) await new Promise((r) => requestAnimationFrame(r));
      }
      // A burst: as many events as the page can take, all at once, timed until drawn.
      const burst = 100000;
      const step = "step-burst";
      feed.onEvents([event("agent.started", { run_id: "run-burst", kind: "run" }), event("llm.started", { step_id: step })]);
      const batch = [];
      for (let i = 0; i < burst; i++) batch.push(event("agent.assistant-stream", { step_id: step, text: `b${i} ` }));
      const t0 = performance.now();
      feed.onEvents(batch);
      while (conversation.queue.length) await new Promise((r) => requestAnimationFrame(r));
      const drained = performance.now() - t0;
      return { out, burst: { events: burst, ms: Math.round(drained), per_s: Math.round(burst / (drained / 1000)) } };
    }, rates);
    for (const r of results.out) assert.ok(r.text_ok, `the text drawn at ${r.offered_per_s}/s is the text fed`);
    // Kept up: never more than 100 ms of events waiting, and all drawn within 50 ms of the end.
    const kept = results.out.filter((r) => r.lag_ms <= 50 && r.max_queue <= r.offered_per_s / 10);
    figures.rendering = {
      per_rate: results.out,
      highest_rate_kept_up_per_s: kept.length ? Math.max(...kept.map((r) => r.offered_per_s)) : 0,
      burst: results.burst,
    };
    t.diagnostic(`rendering: ${JSON.stringify(figures.rendering)}`);
    await page.context().close();
  });

  it("a fast model end to end: the server streams, the page draws", async (t) => {
    const page = await openPage(chromium, server);
    const id = await newSession(page, "Fast model");
    const words = 3000;
    const input = Array.from({ length: words }, (_, i) => `w${i}`).join(" ");
    const started = Date.now();
    await send(page, input);
    await finishedRuns(page, 1, 60000);
    const took = Date.now() - started;
    const events = await server.events(id);
    const deltas = events.filter((e) => e.type === "agent.assistant-stream").length;
    const finished = events.find((e) => e.type === "agent.finished");
    assert.equal(await page.locator(".assistant-text").last().textContent(), finished.data.text);
    const first = Date.parse(events.find((e) => e.type === "agent.started").created_at);
    const last = Date.parse(finished.created_at);
    figures.end_to_end = {
      events: events.length,
      text_deltas: deltas,
      page_ms: took,
      page_events_per_s: Math.round(events.length / (took / 1000)),
      server_run_ms: last - first,
    };
    t.diagnostic(`end to end: ${JSON.stringify(figures.end_to_end)}`);
    await page.context().close();
  });
});
