// Spend in money on the page: a priced mock model, a session with a cap in US dollars. The
// header shows what the session spent and its cap, each model call its cost beside its tokens,
// and a run the cap stopped is shown paused with the hint to raise the cap and resume; once the
// cap is raised (through the API), the page's Resume button finishes the turn.

import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serverAndBrowser, openPage, screenshot } from "./harness.mjs";

/** A providers file with `priced`: the mock model at $2.50 / $10.00 per million tokens. */
function pricedProviders() {
  const path = join(mkdtempSync(join(tmpdir(), "tah-prices-")), "providers.json");
  const prices = { mock: { input_per_mtok: 2.5, output_per_mtok: 10 } };
  writeFileSync(path, JSON.stringify({ providers: { priced: { type: "mock", prices } } }));
  return path;
}

describe("spend in money on the page", () => {
  let server;
  let chromium;

  serverAndBrowser(() => ["--providers", pricedProviders()], (started) => ({ server, chromium } = started));

  it("shows spend and cap, each step's cost, and a paused run that resumes once raised", async () => {
    const agent = await server.api("POST", "/v1/agents", {
      name: "priced", model: "priced/mock", system_prompt: "Be brief.", tools: ["list_files", "read_file"],
    });
    const session = await server.api("POST", "/v1/sessions", { title: "On a budget", agent: agent.id, max_cost_usd: 0.00001 });
    const page = await openPage(chromium, server, { path: `/#/s/${session.id}` });
    await page.waitForFunction(() => document.getElementById("session-title").textContent === "On a budget");
    await page.waitForFunction(() => document.getElementById("session-spend").textContent === "$0 spent of $0.00001 cap");

    const input = page.getByRole("textbox", { name: "Message" });
    await input.fill("What is in this workspace?");
    await input.press("Enter");
    await page.waitForSelector(".run.paused", { timeout: 20000 });
    const foot = await page.locator(".run.paused .run-foot").textContent();
    assert.match(foot, /Paused/);
    assert.match(foot, /raise the cap and resume/);
    // The first call: 9 input and 3 output tokens, (9 × 2.5 + 3 × 10) / 1e6 = $0.0000525.
    assert.deepEqual(await page.locator(".step-cost").allTextContents(), [" · $0.0000525"]);
    await page.waitForFunction(() => document.getElementById("session-state").textContent === "paused (budget)");
    await page.waitForFunction(() => document.getElementById("session-spend").textContent === "$0.0000525 spent of $0.00001 cap");
    assert.equal(await page.locator("#session-spend").getAttribute("class"), "spend-chip over");
    await page.locator("#resume").waitFor({ state: "visible" });
    await screenshot(page, "budget-paused");

    await server.api("POST", `/v1/sessions/${session.id}`, { max_cost_usd: 1 });
    await page.locator("#resume").click();
    await page.waitForSelector(".run.finished:not(.paused)", { timeout: 20000 });
    await page.waitForFunction(() => document.getElementById("session-state").textContent === "completed");
    await page.waitForFunction(() => / spent of \$1 cap$/.test(document.getElementById("session-spend").textContent));
    const costs = await page.locator(".step-cost").allTextContents();
    assert.ok(costs.length >= 2, `${costs}`);
    const events = await server.events(session.id);
    const total = events.filter((e) => e.type === "session.usage").at(-1).data.total_cost_usd;
    const shown = Number((await page.locator("#session-spend").textContent()).match(/\$([0-9.]+) spent/)[1]);
    assert.ok(total > 0.0000525 && Math.abs(shown - total) <= total * 0.01, `${shown} vs ${total}`);
    assert.deepEqual(page.pageErrors, []);
    await screenshot(page, "budget-resumed");
    await page.context().close();
  });
});
