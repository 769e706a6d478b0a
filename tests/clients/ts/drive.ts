// Drives a live tah server through a client generated from openapi.yaml: the types come from
// openapi-typescript (generated/api.d.ts), the calls go through openapi-fetch. Type-checked
// with `tsc --strict`, so a schema that generates the wrong types fails before anything runs.
//
//   TAH_URL=http://127.0.0.1:8080 TAH_TOKEN=... node dist/drive.js
//
// Run by scripts/generated-clients.sh, which starts the server (mock model, a workspace
// holding a README.md, an API token) and generates the types first.

import assert from "node:assert/strict";

import createClient from "openapi-fetch";

import type { components, paths } from "./generated/api.js";

type Schemas = components["schemas"];
type Event = Schemas["Event"];
type EventType = Schemas["EventType"];
type Problem = Schemas["Problem"];

// The wire `type` of every event variant is one of EventType, and every EventType has a
// variant: both directions are checked by the compiler.
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const eventTypesMatch: Same<Event["type"], EventType> = true;

// One entry per event type (the compiler refuses a missing or an unknown one).
const KNOWN_TYPES: Record<EventType, true> = {
  "session.created": true,
  "session.forked": true,
  "session.state": true,
  "session.usage": true,
  "agent.started": true,
  "user.message": true,
  "llm.started": true,
  "agent.assistant-stream": true,
  "agent.thinking-stream": true,
  "llm.completed": true,
  "llm.retry": true,
  "llm.failed": true,
  "tool.started": true,
  "tool.finished": true,
  "artifact.created": true,
  "tool.approval-requested": true,
  "tool.approval-resolved": true,
  "tool.policy-updated": true,
  "tool.client-requested": true,
  "subagent.started": true,
  "subagent.finished": true,
  "agent.context.trimmed": true,
  "agent.context.compacted": true,
  "agent.context.compact-failed": true,
  "storage.checkpoint": true,
  "agent.finished": true,
  "agent.failed": true,
  "agent.cancelled": true,
};

const baseUrl = process.env.TAH_URL ?? "http://127.0.0.1:8080";
const token = process.env.TAH_TOKEN ?? "";

// The JSON bodies (results and problems): the SSE variants of the same responses
// (`text/event-stream`) are left out of the types, as this client never asks for them.
type Json = "application/json" | "application/problem+json";
const client = createClient<paths, Json>({
  baseUrl,
  headers: token ? { Authorization: `Bearer ${token}` } : {},
});
const anonymous = createClient<paths, Json>({ baseUrl });

let checks = 0;
function check(condition: boolean, what: string): asserts condition {
  assert.ok(condition, what);
  checks += 1;
}

function problemKind(problem: Problem): string {
  return problem.type.replace("urn:tah:problem:", "");
}

/** Every event of a session, read page by page (`limit` per page) through `next_cursor`. */
async function allEvents(id: string, limit: number): Promise<Event[]> {
  const events: Event[] = [];
  let after: number | undefined;
  for (let pages = 0; pages < 1000; pages++) {
    const { data, error } = await client.GET("/v1/sessions/{id}/events", {
      params: { path: { id }, query: { limit, after } },
    });
    if (error) throw new Error(`events: ${error.detail}`);
    events.push(...data.data);
    if (data.next_cursor === null) {
      check(data.data.length <= limit, "a last page holds at most `limit` events");
      return events;
    }
    check(data.data.length === limit, "a page followed by another is full");
    after = Number(data.next_cursor);
  }
  throw new Error("events: paging did not end");
}

function checkLog(events: Event[], what: string): void {
  check(events.length > 0, `${what}: the log is not empty`);
  events.forEach((event, i) => {
    check(event.seq === i + 1, `${what}: seq ${event.seq} at position ${i + 1}`);
    check(KNOWN_TYPES[event.type] === true, `${what}: known type ${event.type}`);
    check(!Number.isNaN(Date.parse(event.created_at)), `${what}: created_at is a timestamp`);
  });
}

async function main(): Promise<void> {
  check(eventTypesMatch, "Event['type'] and EventType agree");

  // ---- health, and authentication
  const health = await anonymous.GET("/healthz");
  check(health.data?.status === "ok", "healthz answers ok without a token");
  if (token) {
    const refused = await anonymous.GET("/v1/sessions");
    check(refused.response.status === 401, "a /v1 route without a token is 401");
    check(
      refused.error !== undefined && problemKind(refused.error) === "unauthorized",
      "the 401 is an `unauthorized` problem",
    );
  }

  // ---- create
  const created = await client.POST("/v1/sessions", {
    body: { title: "ts client", metadata: { client: "openapi-fetch", tags: ["a", "b"], n: 1 } },
  });
  if (created.error) throw new Error(`create: ${created.error.detail}`);
  const session = created.data;
  check(created.response.status === 201, "create answers 201");
  check(session.state === "idle", "a new session is idle");
  check(session.metadata.client === "openapi-fetch", "metadata comes back as sent");
  check(Array.isArray(session.metadata.tags), "metadata keeps nested values");
  check(
    created.response.headers.get("location") === `/v1/sessions/${session.id}`,
    "create sets Location",
  );
  const id = session.id;

  // ---- a run, waiting for its result
  const input = "hello from the TypeScript client";
  const ran = await client.POST("/v1/sessions/{id}/runs", {
    params: { path: { id }, query: { wait: true } },
    body: { input },
  });
  if (ran.error) throw new Error(`run: ${ran.error.detail}`);
  check(ran.response.status === 200, "?wait=true answers 200");
  const result = ran.data;
  check("run_id" in result, "?wait=true answers a RunResult");
  check(result.status === "completed", `the run completed (${result.status})`);
  check(result.session_id === id, "the result names its session");
  check(result.text.includes(input), "the mock quotes the input");
  check(result.steps >= 1, "the run made at least one LLM call");
  check(result.usage.output_tokens > 0, "the run reports usage");

  // ---- events as JSON pages
  const events = await allEvents(id, 7);
  checkLog(events, "session");
  const everything = await allEvents(id, 500);
  check(everything.length === events.length, "small and large pages read the same log");
  const first = events[0];
  check(first.type === "session.created", "the log starts with session.created");
  if (first.type === "session.created") {
    check(first.data.session_id === id, "session.created names the session");
    check(first.data.title === "ts client", "session.created carries the title");
  }
  let finished = 0;
  let toolCalls = 0;
  let deltas = "";
  for (const event of events) {
    // Narrowing on `type` gives each event its own `data` type.
    switch (event.type) {
      case "agent.started":
        check(event.data.kind === "run", "agent.started kind is run");
        check(event.data.run_id === result.run_id, "agent.started names the run");
        break;
      case "user.message":
        check(event.data.message.role === "user", "user.message holds a user message");
        check(event.data.message.content === input, "user.message holds the input");
        break;
      case "agent.assistant-stream":
        deltas += event.data.text;
        break;
      case "tool.started":
        check(typeof event.data.call.name === "string", "tool.started names its tool");
        toolCalls += 1;
        break;
      case "tool.finished":
        check(typeof event.data.is_error === "boolean", "tool.finished says if it failed");
        break;
      case "llm.completed":
        check(event.data.usage.input_tokens >= 0, "llm.completed carries usage");
        break;
      case "storage.checkpoint":
        check(
          event.data.step_id === null || typeof event.data.step_id === "string",
          "a checkpoint's step_id is an id or null",
        );
        break;
      case "agent.finished":
        finished += 1;
        check(event.data.run_id === result.run_id, "agent.finished names the run");
        check(event.data.text === result.text, "agent.finished carries the result's text");
        check(event.data.finish_reason === result.finish_reason, "and its finish_reason");
        break;
      default:
        break;
    }
  }
  check(finished === 1, "exactly one agent.finished");
  check(toolCalls >= 1, "the mock called a tool");
  check(deltas.includes(input), "the streamed deltas make up the reply");
  const tail = events[events.length - 1].type;
  check(tail === "agent.finished" || tail === "session.state", `the log ends with the run (${tail})`);

  // ---- the run as a resource
  const runs = await client.GET("/v1/sessions/{id}/runs", { params: { path: { id } } });
  if (runs.error) throw new Error(`runs: ${runs.error.detail}`);
  check(runs.data.data.length === 1 && runs.data.next_cursor === null, "one run, one page");
  check(runs.data.data[0].id === result.run_id, "the run is listed");

  // ---- fork the first turn
  const forked = await client.POST("/v1/sessions/{id}/fork", {
    params: { path: { id } },
    body: { turns: 1 },
  });
  if (forked.error) throw new Error(`fork: ${forked.error.detail}`);
  check(forked.response.status === 201, "fork answers 201");
  check(forked.data.parent_id === id, "the fork names its parent");
  check(forked.data.state === "idle", "a fork is idle");
  check(forked.data.metadata.client === "openapi-fetch", "a fork keeps the metadata");
  const forkEvents = await allEvents(forked.data.id, 100);
  checkLog(forkEvents, "fork");
  const forkedEvent = forkEvents[1];
  check(forkedEvent.type === "session.forked", "a fork's log has session.forked second");
  if (forkedEvent.type === "session.forked") {
    check(forkedEvent.data.parent_id === id, "session.forked names the parent");
    check(forkedEvent.data.turns === 1, "session.forked names the turns");
  }

  // ---- compact
  const compacted = await client.POST("/v1/sessions/{id}/compact", { params: { path: { id } } });
  if (compacted.error) throw new Error(`compact: ${compacted.error.detail}`);
  check(compacted.response.status === 200, "compact answers 200 after a turn");
  check(compacted.data !== undefined && compacted.data.turns === 1, "one turn was summarised");
  check(compacted.data !== undefined && compacted.data.chars > 0, "the summary has text");
  const afterCompact = await allEvents(id, 500);
  checkLog(afterCompact, "after compaction");
  const compactEvent = afterCompact[afterCompact.length - 1];
  check(compactEvent.type === "agent.context.compacted", "compaction is logged");
  if (compactEvent.type === "agent.context.compacted") {
    check(compactEvent.data.auto === false, "a manual compaction is not auto");
    check(compactEvent.data.turns === 1, "the event counts the turns");
  }
  const again = await client.POST("/v1/sessions/{id}/compact", { params: { path: { id } } });
  check(again.response.status === 204 && again.data === undefined, "nothing more to compact: 204");

  // ---- cancel a run in progress (the server runs the mock with a delay between pieces)
  const started = await client.POST("/v1/sessions/{id}/runs", {
    params: { path: { id } },
    body: { input: { role: "user", content: "a run to cancel" } },
  });
  if (started.error) throw new Error(`start: ${started.error.detail}`);
  check(started.response.status === 202, "a run without wait answers 202");
  const run = started.data;
  check("kind" in run && run.status === "running", "202 carries the running Run");
  if (!("kind" in run)) throw new Error("202 without a Run");
  check(
    started.response.headers.get("location") === `/v1/sessions/${id}/runs/${run.id}`,
    "the 202 sets Location",
  );
  const busy = await client.POST("/v1/sessions/{id}/runs", {
    params: { path: { id }, query: { wait: true } },
    body: { input: "a second run at once" },
  });
  check(busy.response.status === 409, "a second run while one is active is 409");
  check(busy.error !== undefined && problemKind(busy.error) === "run-active", "409 run-active");
  const cancelled = await client.POST("/v1/sessions/{id}/cancel", { params: { path: { id } } });
  if (cancelled.error) throw new Error(`cancel: ${cancelled.error.detail}`);
  check(cancelled.data.cancelled, "cancel stopped the active run");
  check(cancelled.data.run_id === run.id, "cancel names the run");
  let status: Schemas["RunStatus"] = run.status;
  for (let i = 0; i < 100 && status === "running"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    const got = await client.GET("/v1/sessions/{id}/runs/{run_id}", {
      params: { path: { id, run_id: run.id } },
    });
    if (got.error) throw new Error(`get run: ${got.error.detail}`);
    status = got.data.status;
  }
  check(status === "cancelled", `the run ended cancelled (${status})`);
  const idle = await client.POST("/v1/sessions/{id}/cancel", { params: { path: { id } } });
  check(idle.data?.cancelled === false, "a second cancel is a no-op");
  const finalLog = await allEvents(id, 500);
  checkLog(finalLog, "after cancel");
  const terminal = finalLog.filter(
    (e) => e.type === "agent.finished" || e.type === "agent.failed" || e.type === "agent.cancelled",
  );
  check(terminal.length === 2, "two runs, two terminal events");
  const last = terminal[1];
  check(last.type === "agent.cancelled" && last.data.run_id === run.id, "agent.cancelled ends it");

  const shown = await client.GET("/v1/sessions/{id}", { params: { path: { id } } });
  if (shown.error) throw new Error(`get: ${shown.error.detail}`);
  check(shown.data.state === "cancelled", "the session is cancelled");
  check(shown.data.last_run?.id === run.id, "get shows the last run");

  // ---- tools, and a call that waits for approval (write_file asks when no rule matches)
  const tools = await client.GET("/v1/tools");
  if (tools.error) throw new Error(`tools: ${tools.error.detail}`);
  const toolNames = tools.data.data.map((t) => t.name);
  check(
    toolNames.includes("read_file") && toolNames.includes("write_file"),
    "GET /v1/tools lists the built-ins",
  );
  check(
    tools.data.data.every(
      (t) => t.source === "builtin" && t.available === (t.reason === undefined),
    ),
    "built-in tools, a reason exactly when unavailable",
  );
  const asking = await client.POST("/v1/sessions", {
    body: {
      title: "ts approvals",
      tools: ["list_files", "read_file", "write_file"],
      tool_policy: [{ tool: "*_file", match: "secret/**", action: "deny" }],
    },
  });
  if (asking.error) throw new Error(`create with tools: ${asking.error.detail}`);
  const aid = asking.data.id;
  check(asking.data.tools?.length === 3, "the session keeps its tools");
  check(asking.data.tool_policy?.[0]?.action === "deny", "and its rules");
  const waiting = await client.POST("/v1/sessions/{id}/runs", {
    params: { path: { id: aid } },
    body: { input: "write a note for the approval" },
  });
  if (waiting.error) throw new Error(`run to approve: ${waiting.error.detail}`);
  let pending: Schemas["PendingApproval"][] = [];
  for (let i = 0; i < 100 && pending.length === 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    const got = await client.GET("/v1/sessions/{id}/approvals", { params: { path: { id: aid } } });
    if (got.error) throw new Error(`approvals: ${got.error.detail}`);
    pending = got.data.data;
  }
  check(pending.length === 1 && pending[0].tool === "write_file", "one write_file call waits");
  check(
    pending[0].subject === "notes.md" && typeof pending[0].expires_at === "string",
    "its subject and expiry",
  );
  const call_id = pending[0].call_id;
  const edited = await client.POST("/v1/sessions/{id}/approvals/{call_id}", {
    params: { path: { id: aid, call_id } },
    body: { decision: "always", input: { path: "secret/x.md", content: "no" } },
  });
  check(
    edited.response.status === 403 &&
      edited.error !== undefined &&
      problemKind(edited.error) === "edited-input-denied",
    "an edited input the policy denies is 403 edited-input-denied",
  );
  const blocked = await client.POST("/v1/sessions/{id}/runs", {
    params: { path: { id: aid } },
    body: { input: "another run meanwhile" },
  });
  check(
    blocked.error !== undefined && problemKind(blocked.error) === "approvals-pending",
    "a new run while a call waits is 409 approvals-pending",
  );
  const denied = await client.POST("/v1/sessions/{id}/approvals/{call_id}", {
    params: { path: { id: aid, call_id } },
    body: { decision: "deny", reason: "not from the ts client" },
  });
  if (denied.error) throw new Error(`deny: ${denied.error.detail}`);
  check(denied.data.decision === "deny" && denied.data.by === "user", "the denial is the user's");
  const changed = await client.POST("/v1/sessions/{id}/approvals/{call_id}", {
    params: { path: { id: aid, call_id } },
    body: { decision: "allow" },
  });
  check(changed.response.status === 409, "another decision afterwards is 409");
  check(
    changed.error !== undefined &&
      "resolution" in changed.error &&
      changed.error.resolution?.decision === "deny",
    "the 409 carries the stored resolution",
  );
  const unknownCall = await client.POST("/v1/sessions/{id}/tool-results/{call_id}", {
    params: { path: { id: aid, call_id: "no-such-call" } },
    body: { output: { any: "json" } },
  });
  check(
    unknownCall.error !== undefined && problemKind(unknownCall.error) === "no-such-call",
    "a result for no waiting call is 404 no-such-call",
  );
  let approvalRun: Schemas["RunStatus"] = "running";
  for (let i = 0; i < 100 && approvalRun === "running"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    const got = await client.GET("/v1/sessions/{id}", { params: { path: { id: aid } } });
    approvalRun = got.data?.last_run?.status ?? "running";
  }
  check(approvalRun === "completed", `the run went on after the denial (${approvalRun})`);
  const approvalLog = await allEvents(aid, 500);
  checkLog(approvalLog, "approvals");
  let requested = 0;
  let resolved = 0;
  for (const event of approvalLog) {
    if (event.type === "tool.approval-requested") {
      requested += 1;
      check(event.data.call_id === call_id && event.data.subject === "notes.md", "the request");
    } else if (event.type === "tool.approval-resolved") {
      resolved += 1;
      check(event.data.by === "user" && event.data.reason === "not from the ts client", "resolved");
    }
  }
  check(requested === 1 && resolved === 1, "one request, one resolution");

  // ---- a session in its own directory, and the artifacts its file tools leave
  const writer = await client.POST("/v1/sessions", {
    body: {
      title: "ts artifacts",
      workspace: "ts/notes",
      tool_policy: [{ tool: "*_file", action: "allow" }],
    },
  });
  if (writer.error) throw new Error(`create with a workspace: ${writer.error.detail}`);
  const wid = writer.data.id;
  check(writer.data.workspace === "ts/notes", "the session keeps its workspace");
  const wrote = await client.POST("/v1/sessions/{id}/runs", {
    params: { path: { id: wid }, query: { wait: true } },
    body: { input: "write a note to `résumé.md`: from the ts client" },
  });
  if (wrote.error) throw new Error(`run that writes: ${wrote.error.detail}`);
  const listedArtifacts = await client.GET("/v1/sessions/{id}/artifacts", {
    params: { path: { id: wid }, query: { all: true } },
  });
  if (listedArtifacts.error) throw new Error(`artifacts: ${listedArtifacts.error.detail}`);
  const artifacts: Schemas["Artifact"][] = listedArtifacts.data.data;
  check(
    artifacts.length === 1 && artifacts[0].path === "résumé.md" && artifacts[0].version === 1,
    "the written file is version 1 of its path",
  );
  const artifact = artifacts[0];
  const one = await client.GET("/v1/sessions/{id}/artifacts/{artifact_id}", {
    params: { path: { id: wid, artifact_id: artifact.id } },
  });
  check(one.data?.sha256 === artifact.sha256, "its record");
  const bytes = await client.GET("/v1/sessions/{id}/artifacts/{artifact_id}/content", {
    params: { path: { id: wid, artifact_id: artifact.id } },
    parseAs: "text",
  });
  check(bytes.response.status === 200, "its content");
  check(
    bytes.data === "write a note to `résumé.md`: from the ts client\n",
    "the bytes the tool wrote",
  );
  check(bytes.response.headers.get("etag") === `"${artifact.sha256}"`, "ETag is the sha256");
  const disposition = bytes.response.headers.get("content-disposition") ?? "";
  check(
    disposition.endsWith("; filename*=UTF-8''r%C3%A9sum%C3%A9.md"),
    "Content-Disposition names the file exactly",
  );
  const unchanged = await client.GET("/v1/sessions/{id}/artifacts/{artifact_id}/content", {
    params: {
      path: { id: wid, artifact_id: artifact.id },
      header: { "If-None-Match": `"${artifact.sha256}"` },
    },
    parseAs: "text",
  });
  check(unchanged.response.status === 304, "If-None-Match with its ETag is 304");
  const writerLog = await allEvents(wid, 500);
  checkLog(writerLog, "artifacts");
  const announced = writerLog.filter((e) => e.type === "artifact.created");
  check(
    announced.length === 1 &&
      announced[0].type === "artifact.created" &&
      announced[0].data.artifact.id === artifact.id,
    "artifact.created carries the record",
  );

  // ---- agents: one on the default provider, a session pinned to it, a turn, an update
  const defaultAgent = await client.GET("/v1/agents/{id}", { params: { path: { id: "default" } } });
  if (defaultAgent.error) throw new Error(`default agent: ${defaultAgent.error.detail}`);
  check(
    defaultAgent.data.name === "default" && defaultAgent.data.version === 1,
    "the default agent is version 1 of `default`",
  );
  const agentBody: Schemas["CreateAgent"] = {
    name: "ts reviewer",
    model: "default/mock",
    system_prompt: "You review code.",
    tools: ["list_files", "read_file"],
    metadata: { client: "openapi-fetch" },
  };
  const madeAgent = await client.POST("/v1/agents", { body: agentBody });
  if (madeAgent.error) throw new Error(`create agent: ${madeAgent.error.detail}`);
  const agent: Schemas["Agent"] = madeAgent.data;
  check(madeAgent.response.status === 201, "create agent answers 201");
  check(agent.version === 1 && agent.model === "default/mock", "version 1, on the mock");
  check(agent.provider === "default", "on the default provider");
  check(agent.archived_at === null, "a new agent is not archived");
  check(madeAgent.response.headers.get("etag") === '"1"', "its ETag is its version");
  check(
    madeAgent.response.headers.get("location") === `/v1/agents/${agent.id}`,
    "create agent sets Location",
  );
  const badAgent = await client.POST("/v1/agents", {
    body: { name: "nowhere", model: "no-such-provider/x" },
  });
  check(
    badAgent.response.status === 400 && badAgent.error !== undefined,
    "an unknown provider is a 400",
  );
  const agentSession = await client.POST("/v1/sessions", {
    body: { title: "ts on an agent", agent: agent.id },
  });
  if (agentSession.error) throw new Error(`create on agent: ${agentSession.error.detail}`);
  const sid = agentSession.data.id;
  const onAgent: Schemas["SessionAgent"] = agentSession.data.agent;
  check(onAgent.id === agent.id && onAgent.name === "ts reviewer", "the session names its agent");
  check(onAgent.version === 1 && onAgent.follows_latest === undefined, "and pins version 1");
  const agentRun = await client.POST("/v1/sessions/{id}/runs", {
    params: { path: { id: sid }, query: { wait: true } },
    body: { input: "hello from the agent's session" },
  });
  if (agentRun.error) throw new Error(`run on agent: ${agentRun.error.detail}`);
  check(
    "run_id" in agentRun.data && agentRun.data.status === "completed",
    "a run on the agent completes",
  );
  const updated = await client.POST("/v1/agents/{id}", {
    params: { path: { id: agent.id }, header: { "If-Match": '"1"' } },
    body: { system_prompt: "You review code, briefly." },
  });
  if (updated.error) throw new Error(`update agent: ${updated.error.detail}`);
  check(updated.data.version === 2, "an update makes version 2");
  check(updated.response.headers.get("etag") === '"2"', "its ETag follows");
  const stale = await client.POST("/v1/agents/{id}", {
    params: { path: { id: agent.id }, header: { "If-Match": '"1"' } },
    body: { description: "too late" },
  });
  check(stale.response.status === 412, "an update with a stale If-Match is 412");
  const versions = await client.GET("/v1/agents/{id}/versions", {
    params: { path: { id: agent.id } },
  });
  if (versions.error) throw new Error(`versions: ${versions.error.detail}`);
  check(
    versions.data.data.map((v) => v.version).join(",") === "2,1",
    "the versions, newest first",
  );
  const v1 = await client.GET("/v1/agents/{id}/versions/{version}", {
    params: { path: { id: agent.id, version: 1 } },
  });
  check(v1.data?.system_prompt === "You review code.", "version 1 is kept as it was");
  const pinned = await client.GET("/v1/sessions/{id}", { params: { path: { id: sid } } });
  if (pinned.error) throw new Error(`get on agent: ${pinned.error.detail}`);
  check(
    pinned.data.agent.name === "ts reviewer" && pinned.data.agent.version === 1,
    "the pinned session stays on version 1",
  );
  const following = await client.POST("/v1/sessions", {
    body: { agent: { id: agent.id, version: "latest" } },
  });
  if (following.error) throw new Error(`create following: ${following.error.detail}`);
  check(
    following.data.agent.version === 2 && following.data.agent.follows_latest === true,
    "a session that follows the agent shows its latest version",
  );
  const agentLog = await allEvents(sid, 500);
  checkLog(agentLog, "agent session");
  const createdOnAgent = agentLog[0];
  check(
    createdOnAgent.type === "session.created" &&
      createdOnAgent.data.agent?.id === agent.id &&
      createdOnAgent.data.agent?.version === 1 &&
      createdOnAgent.data.model === "default/mock",
    "session.created records the agent, its version and the model",
  );
  const archived = await client.DELETE("/v1/agents/{id}", { params: { path: { id: agent.id } } });
  if (archived.error) throw new Error(`archive: ${archived.error.detail}`);
  check(typeof archived.data.archived_at === "string", "archive sets archived_at");
  const refused = await client.POST("/v1/sessions", { body: { agent: agent.id } });
  check(refused.response.status === 409, "a new session on an archived agent is 409");
  const listed = await client.GET("/v1/agents", { params: { query: { include_archived: true } } });
  check(
    listed.data?.data.some((a) => a.id === agent.id) === true,
    "include_archived lists the archived agent",
  );
  const providers = await client.GET("/v1/providers");
  if (providers.error) throw new Error(`providers: ${providers.error.detail}`);
  const firstProvider: Schemas["Provider"] = providers.data.data[0];
  check(firstProvider.name === "default", "GET /v1/providers lists default first");
  check(firstProvider.type === "mock", "the default provider is the mock here");

  // ---- problems are typed too
  const missing = await client.GET("/v1/sessions/{id}", {
    params: { path: { id: "00000000-0000-7000-8000-000000000000" } },
  });
  check(missing.response.status === 404, "an unknown session is 404");
  check(missing.error !== undefined && problemKind(missing.error) === "not-found", "404 not-found");
  check(
    missing.response.headers.get("content-type")?.startsWith("application/problem+json") === true,
    "errors are problem+json",
  );

  const deleted = await client.DELETE("/v1/sessions/{id}", {
    params: { path: { id: forked.data.id } },
  });
  check(deleted.response.status === 204, "delete answers 204");

  console.log(`ts client: ${checks} checks passed`);
}

main().catch((error: unknown) => {
  console.error("ts client: FAILED:", error);
  process.exit(1);
});
