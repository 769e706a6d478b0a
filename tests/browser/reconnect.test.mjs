// The server dies in the middle of a run (kill -9) and comes back on the same address: the
// page says it is disconnected while it is, reconnects by itself with Last-Event-ID, shows
// every event exactly once (the streamed text is not repeated), and the run can be resumed.

import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { serverAndBrowser, openPage, screenshot, newSession, send, finishedRuns, inspectorSeqs, sleep } from "./harness.mjs";

describe("a server restart in the middle of a run", () => {
  let server;
  let chromium;

  // Slow pieces, so that the run is still streaming when the server is killed.
  serverAndBrowser(["--mock-delay-ms", "60"], (started) => ({ server, chromium } = started));

  it("shows a banner, reconnects, shows nothing twice, and resumes", async () => {
    const page = await openPage(chromium, server);
    const id = await newSession(page, "Restarted");
    const words = Array.from({ length: 120 }, (_, i) => `word${i}`).join(" ");
    await send(page, `Please repeat: ${words}`);
    // Wait until the reply is well under way.
    await page.waitForFunction(
      () => (document.querySelector(".assistant.streaming .assistant-text")?.textContent ?? "").length > 80,
      null,
      { timeout: 15000 },
    );
    await server.stop("SIGKILL");
    await page.waitForSelector("#banner:not([hidden])", { timeout: 10000 });
    assert.match(await page.locator("#banner").textContent(), /reconnecting/i);
    await screenshot(page, "reconnecting");
    // Down for a moment: the page keeps trying.
    await sleep(1000);
    assert.equal(await page.locator("#banner").isVisible(), true);

    // Back with quicker pieces, so that the resumed run does not take as long.
    await server.restart(["--mock-delay-ms", "5"]);
    await page.waitForSelector("#banner[hidden]", { state: "attached", timeout: 15000 });
    // The restarted server recorded the run as interrupted; the page shows it and offers Resume.
    await page.waitForSelector(".run.failed", { timeout: 15000 });
    assert.equal(await page.locator(".run.failed .run-foot strong").textContent(), "Interrupted");
    await page.getByRole("button", { name: "Resume" }).waitFor();

    const events = await server.events(id);
    await page.waitForFunction((n) => Number(document.getElementById("log").dataset.lastSeq) >= n, events.at(-1).seq);
    // Every event once, in order, none missing.
    await page.getByRole("button", { name: "Events" }).click();
    await page.waitForFunction((n) => document.querySelectorAll("#inspector-list li").length >= n, events.length);
    const seqs = await inspectorSeqs(page);
    assert.deepEqual(seqs, events.map((e) => e.seq));
    assert.equal(new Set(seqs).size, seqs.length);
    // The text streamed before the crash is the reply's text exactly as the log has it, once,
    // and is shown so (drawn as markdown: a paragraph without its trailing space).
    const streamed = events.filter((e) => e.type === "agent.assistant-stream").map((e) => e.data.text).join("");
    const sources = await page.evaluate(() => [...window.tah.conversation.blocks.values()].map((b) => b.source).filter(Boolean));
    assert.deepEqual(sources, [streamed]);
    const shown = await page.locator(".assistant-text").last().textContent();
    assert.equal(shown, streamed.trimEnd());
    await page.getByRole("button", { name: "Close the event inspector" }).click();

    // Resume finishes the turn.
    await page.getByRole("button", { name: "Resume" }).click();
    await finishedRuns(page, 1, 30000);
    const after = await server.events(id);
    const finished = after.find((e) => e.type === "agent.finished");
    assert.equal(await page.locator(".run.finished .assistant-text").last().textContent(), finished.data.text.trimEnd());
    assert.equal(await page.locator(".run.finished .run-kind").textContent(), "Resumed run");
    assert.deepEqual(page.pageErrors, []);
    await page.context().close();
  });
});
