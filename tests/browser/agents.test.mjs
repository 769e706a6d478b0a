// Agents on the page: "New session" runs the agent picked (by name and model), the header shows
// the agent and version the session runs, and the agents page lists every agent with its model,
// version and archived state, and one agent's versions with what each changed. Agent names in
// any language, and one that tries to be HTML, are shown as text.

import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serverAndBrowser, openPage, screenshot, send, finishedRuns } from "./harness.mjs";

const CODER = "Кодер · κώδικας · مبرمج · coder";
const ATTACK = `<img src=x onerror="window.__xss=1"><b>bold</b>`;

/** A providers file naming a second provider, `local` (the mock too), beside `default`. */
function providersFile() {
  const dir = mkdtempSync(join(tmpdir(), "tah-providers-"));
  const path = join(dir, "providers.json");
  writeFileSync(path, JSON.stringify({ providers: { local: { type: "mock" } } }));
  after(() => rmSync(dir, { recursive: true, force: true }));
  return path;
}

/** Two agents on two providers through the API (the first updated once), and a third archived. */
async function agentsOf(server) {
  const coder = await server.api("POST", "/v1/agents", {
    name: CODER,
    description: "Reads the workspace and says what is in it.",
    model: "mock-small",
    system_prompt: "You read code.",
    tools: ["list_files", "read_file", "write_file"],
  });
  const updated = await server.api("POST", `/v1/agents/${coder.id}`, {
    model: "mock-large",
    system_prompt: "You read code.\nYou answer in one paragraph.",
    tools: ["list_files", "read_file"],
  });
  const attack = await server.api("POST", "/v1/agents", { name: ATTACK, model: "local/mock-small", metadata: { team: "<i>red</i>" } });
  const retired = await server.api("POST", "/v1/agents", { name: "retired", model: "mock-small" });
  await server.api("DELETE", `/v1/agents/${retired.id}`);
  return { coder: updated, attack, retired };
}

/** What of the page ran or was parsed as markup: nothing, when everything is text. */
function injected(page) {
  return page.evaluate(() => ({
    xss: window.__xss ?? null,
    markup: document.querySelectorAll("#app img, #app b, #app i, #new-agent img").length,
  }));
}

describe("agents on the page", () => {
  let server;
  let chromium;

  serverAndBrowser(["--mock-delay-ms", "5", "--providers", providersFile()], (started) => ({ server, chromium } = started));

  it("a new session runs the agent picked; the header shows its name and version", async () => {
    const { coder, attack, retired } = await agentsOf(server);
    assert.equal(coder.version, 2);
    const fallback = await server.api("GET", "/v1/agents/default");
    // A session on the agent whose name is markup: the session list names its agent.
    await server.api("POST", "/v1/sessions", { title: "Markup", agent: attack.id });
    const page = await openPage(chromium, server);
    const markup = page.locator("#session-list .session-link").filter({ hasText: "Markup" });
    assert.match(await markup.textContent(), / · <img src=x onerror="window.__xss=1"><b>bold<\/b>$/);

    await page.getByRole("button", { name: "New session" }).first().click();
    const picker = page.getByLabel("Agent", { exact: true });
    await page.waitForSelector("#new-agent[data-loaded=true]");
    const options = await picker.locator("option").evaluateAll((os) => os.map((o) => [o.value, o.textContent]));
    // The default agent first (nothing is sent for it), then the stored ones, newest first; an
    // archived agent is not offered.
    assert.deepEqual(options, [
      ["", `default · ${fallback.model} (the server's)`],
      [attack.id, `${ATTACK} · local/mock-small`],
      [coder.id, `${CODER} · mock-large`],
    ]);
    assert.ok(!options.some(([id]) => id === retired.id));
    await picker.selectOption(coder.id);
    await page.getByLabel("Title").fill("Agent tour");
    await screenshot(page, "agent-picker");
    await page.getByRole("button", { name: "Create" }).click();
    await page.waitForSelector("#composer:not([hidden])");
    const id = await page.evaluate(() => location.hash.split("/").pop());

    const record = await server.api("GET", `/v1/sessions/${id}`);
    assert.deepEqual({ id: record.agent.id, version: record.agent.version, name: record.agent.name }, { id: coder.id, version: 2, name: CODER });
    await send(page, "What is in this workspace?");
    await finishedRuns(page, 1);

    const chip = page.locator("#session-agent");
    assert.equal(await chip.locator(".agent-name").textContent(), CODER);
    assert.equal(await chip.locator(".agent-version").textContent(), "v2");
    assert.equal(await chip.getAttribute("href"), `#/agents/${coder.id}`);
    assert.equal(await chip.textContent(), `${CODER}v2`);
    assert.match(await page.locator("#session-list .session-link[aria-current=page]").textContent(), new RegExp(`· ${CODER}`));
    const created = (await server.events(id)).find((e) => e.type === "session.created");
    assert.deepEqual(created.data.agent, { id: coder.id, version: 2, name: CODER });
    await screenshot(page, "agent-session");

    // A session on the default agent says so too.
    await page.getByRole("button", { name: "New session" }).first().click();
    await page.waitForSelector("#new-agent[data-loaded=true]");
    assert.equal(await picker.inputValue(), "");
    await page.getByLabel("Title").fill("On the default agent");
    await page.getByRole("button", { name: "Create" }).click();
    await page.waitForFunction(() => document.getElementById("session-title").textContent === "On the default agent");
    await page.waitForSelector("#session-agent:not([hidden])");
    assert.equal(await chip.locator(".agent-name").textContent(), "default");
    assert.equal(await chip.locator(".agent-version").textContent(), "v1");

    // One that follows the agent's updates says so.
    const follows = await server.api("POST", "/v1/sessions", { title: "Following", agent: { id: coder.id, version: "latest" } });
    await page.evaluate((sid) => (location.hash = `#/s/${sid}`), follows.id);
    await page.waitForFunction(() => document.getElementById("session-title").textContent === "Following");
    assert.equal(await chip.textContent(), `${CODER}v2latest`);
    assert.match(await chip.getAttribute("title"), /following its latest version/);

    assert.deepEqual(await injected(page), { xss: null, markup: 0 });
    assert.deepEqual(page.pageErrors, []);
    await page.context().close();
  });

  it("the agents page lists the agents, and one agent's versions with what changed", async () => {
    const list = await server.api("GET", "/v1/agents?include_archived=true");
    const coder = list.data.find((a) => a.name === CODER);
    const page = await openPage(chromium, server, { path: "/#/agents" });
    await page.waitForSelector("#agent-list li");
    assert.equal(await page.locator("#app").getAttribute("data-view"), "agents");
    assert.equal(await page.locator("#session-title").textContent(), "Agents");

    // The default agent first, then every stored one (archived included), newest first.
    const rows = page.locator("#agent-list .agent-link");
    const names = await rows.locator(".agent-title .agent-name").allTextContents();
    assert.deepEqual(names, ["default", "retired", ATTACK, CODER]);
    const retired = rows.filter({ hasText: "retired" });
    assert.equal(await retired.locator(".archived-badge").textContent(), "archived");
    assert.equal(await page.locator("#agent-list .archived-badge").count(), 1);
    assert.match(await rows.nth(3).locator(".agent-line").textContent(), /mock-large\s*v2/);
    // The providers the agents may name: the flags' and the file's.
    assert.deepEqual(await page.locator("#provider-list .provider").evaluateAll((ps) => ps.map((p) => p.textContent)), ["defaultmock", "localmock"]);

    // One agent: its configuration, and its versions, newest first, each with what it changed.
    await rows.nth(3).click();
    await page.waitForSelector("#agent-detail .agent-version-item");
    assert.equal(await page.evaluate(() => location.hash), `#/agents/${coder.id}`);
    assert.equal(await page.locator("#agent-detail .agent-heading .agent-name").textContent(), CODER);
    assert.match(await page.locator("#agent-detail .agent-facts").textContent(), new RegExp(`version 2\\s*provider ${coder.provider}`));
    const versions = page.locator("#agent-detail .agent-version-item");
    assert.deepEqual(await versions.evaluateAll((vs) => vs.map((v) => v.dataset.version)), ["2", "1"]);
    const changed = await versions.first().locator(".change").evaluateAll((cs) => cs.map((c) => c.dataset.field));
    assert.deepEqual(changed, ["model", "system_prompt", "tools"]);
    const model = versions.first().locator(".change[data-field=model]");
    assert.equal(await model.locator(".change-old").textContent(), "mock-small");
    assert.equal(await model.locator(".change-new").textContent(), "mock-large");
    const prompt = await versions.first().locator(".change[data-field=system_prompt] .diff-line.add").allTextContents();
    assert.deepEqual(prompt.map((l) => l.trim()), ["+You answer in one paragraph."]);
    const tools = versions.first().locator(".change[data-field=tools]");
    assert.deepEqual(await tools.locator("del").allTextContents(), ["− write_file"]);
    assert.equal(await tools.locator("ins").count(), 0);
    assert.match(await versions.last().textContent(), /Created\./);
    await screenshot(page, "agents");

    // The one whose name is markup, as text; its metadata too.
    await rows.nth(2).click();
    await page.waitForFunction((name) => document.querySelector("#agent-detail .agent-heading .agent-name")?.textContent === name, ATTACK);
    assert.match(await page.locator("#agent-detail .agent-config").textContent(), /<i>red<\/i>/);
    assert.match(await page.locator("#agent-detail .agent-facts").textContent(), /provider local/);
    assert.match(await rows.nth(2).locator(".agent-line").textContent(), /^local\/mock-small\s*v1/);
    assert.deepEqual(await injected(page), { xss: null, markup: 0 });

    // The default agent, from the server's flags.
    await rows.nth(0).click();
    await page.waitForFunction(() => document.querySelector("#agent-detail .agent-heading .agent-name")?.textContent === "default");
    assert.equal(await page.locator("#agent-detail .agent-version-item").count(), 1);
    // Without a tool list an agent has every tool the server offers; the page says so.
    assert.match(await page.locator("#agent-detail .agent-config").textContent(), /Toolsevery tool the server offers/);

    assert.deepEqual(page.pageErrors, []);
    await page.context().close();

    // A phone-sized window stacks the list over the agent, opened by its address.
    const phone = await openPage(chromium, server, { width: 390, height: 820, path: `/#/agents/${coder.id}` });
    await phone.waitForFunction((name) => document.querySelector("#agent-detail .agent-heading .agent-name")?.textContent === name, CODER);
    assert.equal(await phone.locator("#agent-list .agent-link[aria-current=page] .agent-name").textContent(), CODER);
    await screenshot(phone, "agents-narrow");
    assert.deepEqual(phone.pageErrors, []);
    await phone.context().close();
  });
});
