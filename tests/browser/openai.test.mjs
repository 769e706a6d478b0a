// The page against tah on the OpenAI provider, talking to the fake OpenAI-compatible model
// (`tah fake-model`): a real Chat Completions stream, with a tool call, drawn like the mock's.

import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { serverAndBrowser, fakeModel, openPage, newSession, send, finishedRuns } from "./harness.mjs";

describe("the page on the fake OpenAI model", () => {
  let model;
  let server;
  let chromium;

  before(async () => {
    model = await fakeModel(["--pieces", "40", "--piece-delay-ms", "5", "--tool-calls", "1"]);
    process.env.OPENAI_API_KEY = "sk-browser-test-not-a-real-key";
  });
  serverAndBrowser(
    () => ["--provider", "openai", "--base-url", model.url, "--model", "fake-model"],
    (started) => ({ server, chromium } = started),
  );
  after(async () => {
    await model?.stop();
  });

  it("streams the model's text and shows its tool call", async () => {
    const page = await openPage(chromium, server);
    const id = await newSession(page, "On the OpenAI wire");
    await send(page, "list the files, please");
    await finishedRuns(page, 1);
    const card = page.locator(".tool-card");
    assert.equal(await card.count(), 1);
    assert.equal(await card.locator(".tool-name").textContent(), "list_files");
    assert.equal(await card.getAttribute("data-status"), "done");
    const events = await server.events(id);
    const finished = events.find((e) => e.type === "agent.finished");
    const deltas = events.filter((e) => e.type === "agent.assistant-stream");
    assert.ok(deltas.length >= 40, `${deltas.length} deltas`);
    // Drawn as markdown: the paragraph without its trailing space.
    assert.equal(await page.locator(".assistant-text").last().textContent(), finished.data.text.trimEnd());
    assert.match(await page.locator(".run.finished .usage").textContent(), / in · .* out tokens/);
    assert.deepEqual(page.pageErrors, []);
    await page.context().close();
  });
});
