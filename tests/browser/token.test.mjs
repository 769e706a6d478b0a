// A page opened with a session token (`#/s/<id>?token=tahs_…`, as an app hands its end users a
// link): it shows that one session and nothing else, authenticated by the token (no sign-in,
// no list), moves the token out of the address, follows the event stream with it, and runs a
// turn with an `interact` token. A `read` token shows the session and cannot run.

import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { serverAndBrowser, openPage, screenshot, send, finishedRuns } from "./harness.mjs";

const TOKEN = "browser-test-token-7c2e94a0b1";

describe("a session token link", () => {
  let server;
  let chromium;

  serverAndBrowser(["--api-token", TOKEN], (started) => ({ server, chromium } = started));

  it("shows the one session, by its token, and runs a turn with an interact token", async () => {
    const session = await server.api("POST", "/v1/sessions", { title: "Shared with a user" }, TOKEN);
    const other = await server.api("POST", "/v1/sessions", { title: "Not shared" }, TOKEN);
    await server.api("POST", `/v1/sessions/${session.id}/runs?wait=true`, { input: "first turn" }, TOKEN);
    const made = await server.api("POST", `/v1/sessions/${session.id}/tokens`, { scope: "interact" }, TOKEN);
    assert.match(made.token, /^tahs_[0-9a-f]{64}$/);

    const urls = [];
    const page = await openPage(chromium, server, { path: `/#/s/${session.id}?token=${made.token}` });
    page.on("request", (request) => urls.push(request.url()));
    await page.waitForSelector("#log[data-caught-up=true]");
    assert.equal(await page.locator("#session-title").textContent(), "Shared with a user");
    assert.equal(await page.locator(".run.finished").count(), 1);
    // The token left the address; the page shows no sign-in, no list, and no other session.
    assert.equal(await page.evaluate(() => location.hash), `#/s/${session.id}`);
    assert.equal(await page.locator("#sidebar").isHidden(), true);
    assert.equal(await page.locator("#app").getAttribute("data-view") === "signin", false);
    assert.equal(await page.getByText("Not shared").count(), 0);

    await send(page, "a second turn, from the link");
    await finishedRuns(page, 2);
    // The second run reached the page through its event stream, which the token opened.
    assert.ok(urls.some((u) => u.endsWith(`/v1/sessions/${session.id}/runs`)), urls.join("\n"));
    assert.ok(!urls.some((u) => u.includes(made.token)), "the token is in no URL");
    const runs = await server.api("GET", `/v1/sessions/${session.id}/runs`, undefined, TOKEN);
    assert.equal(runs.data.length, 2);
    await screenshot(page, "session-token");

    // The same token reaches no other session.
    const refused = await fetch(`${server.url}/v1/sessions/${other.id}`, {
      headers: { authorization: `Bearer ${made.token}` },
    });
    assert.equal(refused.status, 403);
    assert.deepEqual(page.pageErrors, []);
    await page.context().close();
  });

  it("shows the session with a read token and refuses its runs", async () => {
    const session = await server.api("POST", "/v1/sessions", { title: "Read only" }, TOKEN);
    await server.api("POST", `/v1/sessions/${session.id}/runs?wait=true`, { input: "watch this" }, TOKEN);
    const made = await server.api("POST", `/v1/sessions/${session.id}/tokens`, { scope: "read" }, TOKEN);
    const page = await openPage(chromium, server, { path: `/#/s/${session.id}?token=${made.token}` });
    await page.waitForSelector("#log[data-caught-up=true]");
    assert.equal(await page.locator(".run.finished").count(), 1);
    const refused = await page.evaluate(async ([id, token]) => {
      const response = await fetch(`/v1/sessions/${id}/runs`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify({ input: "not allowed" }),
      });
      return response.status;
    }, [session.id, made.token]);
    assert.equal(refused, 403);
    assert.deepEqual(page.pageErrors, []);
    await page.context().close();
  });
});
