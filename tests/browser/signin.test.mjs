// A server with an API token: the page asks for it, trades it for an HttpOnly cookie that no
// script can read and that is not the token, works through that cookie (the event stream
// included), stays signed in across a reload, and signs out, after which the same cookie is
// refused.

import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { serverAndBrowser, openPage, screenshot, newSession, send, finishedRuns } from "./harness.mjs";

const TOKEN = "browser-test-token-5d0c81f2a9";

describe("sign-in with an API token", () => {
  let server;
  let chromium;

  serverAndBrowser(["--api-token", TOKEN], (started) => ({ server, chromium } = started));

  it("asks for the token, signs in with a cookie, runs a turn, signs out", async () => {
    const page = await openPage(chromium, server);
    assert.equal(await page.locator("#app").getAttribute("data-view"), "signin");
    await screenshot(page, "signin");

    const field = page.getByLabel("API token");
    await field.fill("not-the-token-at-all");
    await field.press("Enter");
    await page.waitForSelector("#signin-error:not([hidden])");
    assert.equal(await page.locator("#signin-error").textContent(), "That token is not valid.");

    await field.fill(TOKEN);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.waitForFunction(() => document.getElementById("app").dataset.view === "welcome");
    const cookies = await page.context().cookies();
    const cookie = cookies.find((c) => c.name === "tah_token");
    assert.ok(cookie, "the sign-in cookie is set");
    assert.equal(cookie.httpOnly, true);
    assert.equal(cookie.sameSite, "Strict");
    assert.equal(await page.evaluate(() => document.cookie.includes("tah_token")), false, "no script can read it");
    assert.match(cookie.value, /^[0-9a-f]{64}$/, "32 random bytes");
    assert.ok(!cookie.value.includes(Buffer.from(TOKEN).toString("hex")), "not the token");

    // Everything works through the cookie, the event stream included; no token in any URL.
    const urls = [];
    page.on("request", (request) => urls.push(request.url()));
    const id = await newSession(page, "Signed in");
    await send(page, "hello with a cookie");
    await finishedRuns(page, 1);
    assert.ok(urls.some((u) => u.endsWith(`/v1/sessions/${id}/events`)), "the page followed the events");
    assert.ok(!urls.some((u) => u.includes(TOKEN) || u.includes("access_token")), urls.join("\n"));
    const stored = await server.api("GET", `/v1/sessions/${id}`, undefined, TOKEN);
    assert.equal(stored.state, "completed");

    // A reload keeps the sign-in.
    await page.reload();
    await page.waitForSelector("#log[data-caught-up=true]");
    assert.equal(await page.locator(".run.finished").count(), 1);

    await page.getByRole("button", { name: "Sign out" }).click();
    await page.waitForFunction(() => document.getElementById("app").dataset.view === "signin");
    const left = (await page.context().cookies()).filter((c) => c.name === "tah_token");
    assert.deepEqual(left, []);
    // A copy of the cookie taken before signing out is refused.
    const replayed = await fetch(`${server.url}/v1/sessions`, { headers: { cookie: `tah_token=${cookie.value}` } });
    assert.equal(replayed.status, 401);
    await page.reload();
    await page.waitForFunction(() => document.getElementById("app").dataset.view === "signin");
    assert.deepEqual(page.pageErrors, []);
    await page.context().close();
  });
});
