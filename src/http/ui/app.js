// The page: sign-in, the session list, one open session (its conversation, live), the input
// and the session's actions, and the agents page. The address says what is open (`#/s/<id>`,
// `#/agents`, `#/agents/<id>`), so the back button and links work. Opened as
// `#/s/<id>?token=tahs_…` with a session token, it shows that one session and nothing else,
// authenticated by the token (an end user of an app needs no key and no sign-in).

import { api, ApiError, authEvents, auth, sessions, useSessionToken } from "./api.js";
import { h, clear, show, isId, clock, count, usd } from "./dom.js";
import { EventFeed } from "./stream.js";
import { Conversation } from "./conversation.js";
import { Inspector } from "./inspector.js";
import { SessionList } from "./sessions.js";
import { AgentsPage, fillAgentPicker, drawSessionAgent, isAgentId } from "./agents.js";

const $ = (id) => document.getElementById(id);

const ui = {
  app: $("app"),
  sidebar: $("sidebar"),
  title: $("session-title"),
  meta: $("session-meta"),
  agent: $("session-agent"),
  spend: $("session-spend"),
  agents: $("agents"),
  agentsLink: $("agents-link"),
  state: $("session-state"),
  actions: $("session-actions"),
  banner: $("banner"),
  notice: $("notice"),
  welcome: $("welcome"),
  signin: $("signin"),
  conversation: $("conversation"),
  log: $("log"),
  composer: $("composer"),
  input: $("input"),
  send: $("send"),
  cancel: $("cancel"),
  resume: $("resume"),
  compact: $("compact"),
  remove: $("delete-session"),
  inspector: $("inspector"),
  inspectorToggle: $("inspector-toggle"),
  artifactsToggle: $("artifacts-toggle"),
  artifacts: $("artifacts"),
  artifactList: $("artifact-list"),
  signOut: $("sign-out"),
};

const list = new SessionList($("session-list"), $("session-list-empty"), { onError: (e) => toast(e.message, "error") });
const inspector = new Inspector($("inspector-list"), $("inspector-hide-stream"));
const agentsPage = new AgentsPage($("agent-list"), $("agent-detail"), $("provider-list"), {
  onHeader: (title, meta) => {
    setText(ui.title, title);
    setText(ui.meta, meta);
  },
  onError: (e) => toast(e.message, "error"),
});

/** The open session: its record, conversation and feed. */
let open = null;
/** Whether this server has the artifact routes (they arrive in a later version). */
let artifactsRoute = true;
let authRequired = false;

// ---- views -------------------------------------------------------------------------------

function view(name) {
  ui.app.dataset.view = name;
  show(ui.welcome, name === "welcome");
  show(ui.signin, name === "signin");
  show(ui.conversation, name === "session");
  show(ui.composer, name === "session");
  show(ui.actions, name === "session");
  show(ui.state, name === "session");
  show(ui.agents, name === "agents");
  if (name === "agents") ui.agentsLink.setAttribute("aria-current", "page");
  else ui.agentsLink.removeAttribute("aria-current");
  if (name !== "session") {
    show(ui.agent, false);
    show(ui.spend, false);
    show(ui.artifacts, false);
    setInspector(false);
  }
}

let toastTimer = null;
/** A short message under the top bar (errors stay until the next one or a click). */
function toast(text, tone = "info") {
  ui.notice.textContent = text;
  ui.notice.dataset.tone = tone;
  show(ui.notice, true);
  clearTimeout(toastTimer);
  if (tone !== "error") toastTimer = setTimeout(() => show(ui.notice, false), 5000);
}
ui.notice.addEventListener("click", () => show(ui.notice, false));

function setBanner(text) {
  ui.banner.textContent = text ?? "";
  show(ui.banner, Boolean(text));
}

// ---- sign-in -----------------------------------------------------------------------------

async function showSignIn() {
  open?.stop();
  open = null;
  list.stop();
  clear($("session-list"));
  ui.title.textContent = "tah";
  ui.meta.textContent = "";
  view("signin");
  $("signin-token").focus();
}

authEvents.addEventListener("unauthorized", () => {
  if (ui.app.dataset.mode === "session-token") {
    setBanner("This link's session token has expired or is not valid: ask for a new link.");
    return;
  }
  if (ui.app.dataset.view !== "signin") showSignIn();
});

$("signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const field = $("signin-token");
  const error = $("signin-error");
  error.hidden = true;
  try {
    await auth.signIn(field.value.trim());
    field.value = "";
    await start();
  } catch (e) {
    error.textContent = e.status === 401 ? "That token is not valid." : e.message;
    error.hidden = false;
    field.select();
  }
});

ui.signOut.addEventListener("click", async () => {
  try {
    await auth.signOut();
  } finally {
    showSignIn();
  }
});

// ---- the open session --------------------------------------------------------------------

class OpenSession {
  constructor(record) {
    this.id = record.id;
    this.record = record;
    this.state = record.state;
    this.openedAt = performance.now();
    this.caughtUpAt = record.last_seq;
    this.conversation = new Conversation(ui.log, {
      approve: (callId, decision, reason) => sessions.approve(this.id, callId, decision, reason),
      toolResult: (callId, output, isError) => sessions.toolResult(this.id, callId, output, isError),
      fork: (turns, text) => forkAt(this, turns, text),
      request: (stepId) => sessions.step(this.id, stepId),
      artifactUrl: (artifactId) => sessions.artifactUrl(this.id, artifactId),
    });
    this.conversation.onFlush = (c) => this.flushed(c);
    /** Usage of model calls whose events came after the record was read: `{seq, usage}`. */
    this.newUsage = [];
    inspector.reset();
    this.feed = null;
  }

  async begin() {
    if (this.record.parent_id) {
      try {
        await this.loadHistory();
      } catch (error) {
        toast(`Could not load the copied history: ${error.message}`, "error");
      }
    }
    if (open !== this) return;
    this.feed = new EventFeed(sessions.eventsUrl(this.id), {
      onEvents: (events) => this.received(events),
      onStatus: (status) => this.status(status),
    });
  }

  /** A fork's copied messages: those before the first message of its own log. */
  async loadHistory() {
    const first = await sessions.firstEvents(this.id, 100);
    const own = (first?.data ?? []).find((e) => e.type === "user.message");
    const cut = own ? own.data.message.index : Infinity;
    const messages = await sessions.messages(this.id);
    if (open === this) this.conversation.renderHistory(messages.filter((m) => m.index < cut));
  }

  stop() {
    this.feed?.stop();
    this.conversation.stop();
  }

  received(events) {
    if (open !== this) return;
    this.conversation.push(events);
    inspector.push(events);
    for (const event of events) {
      if (event.type === "llm.completed" && event.data?.usage && event.seq > this.record.last_seq) {
        this.newUsage.push({ seq: event.seq, usage: event.data.usage });
      }
      if (event.type === "session.usage" && event.data?.total_cost_usd != null) this.totalCost = event.data.total_cost_usd;
      if (event.type === "session.state" && event.data?.to) this.setState(event.data.to);
      if (event.type === "artifact.created") loadArtifacts(this);
      if (event.type === "agent.context.compacted") toast("Compacted.", "info");
      if (["agent.finished", "agent.failed", "agent.cancelled", "agent.context.compacted"].includes(event.type)) {
        this.refreshRecord();
      }
    }
  }

  flushed(conversation) {
    if (!this.markedCaughtUp && conversation.lastSeq >= this.caughtUpAt && !conversation.queue.length) {
      this.markedCaughtUp = true;
      performance.mark("tah:caught-up");
      ui.log.dataset.caughtUp = "true";
    }
    ui.log.dataset.lastSeq = String(conversation.lastSeq);
    drawHeader(this);
    updateControls();
  }

  status(status) {
    if (open !== this) return;
    ui.conversation.dataset.stream = status;
    if (status === "live") setBanner(null);
    else if (status === "reconnecting") setBanner("Connection to the server lost — reconnecting…");
    else if (status === "unauthorized") showSignIn();
    else if (status === "gone") {
      setBanner(null);
      toast("This session no longer exists.", "error");
      location.hash = "#/";
    }
    if (status === "live") this.refreshRecord();
  }

  /**
   * Reads the session again (its title, and usage the events do not carry: a compaction's),
   * at once; a request made while one is under way is made when it ends.
   */
  refreshRecord() {
    if (this.reading) {
      this.readAgain = true;
      return;
    }
    this.reading = true;
    sessions
      .get(this.id)
      .then((r) => open === this && this.setRecord(r))
      .catch(() => {})
      .finally(() => {
        this.reading = false;
        if (this.readAgain && open === this) {
          this.readAgain = false;
          this.refreshRecord();
        }
      });
  }

  /** The session's usage: the record's, and that of the model calls the record came before. */
  usage() {
    const total = { input_tokens: this.record.usage?.input_tokens ?? 0, output_tokens: this.record.usage?.output_tokens ?? 0 };
    for (const { usage } of this.newUsage) {
      total.input_tokens += usage.input_tokens ?? 0;
      total.output_tokens += usage.output_tokens ?? 0;
    }
    return total;
  }

  /** What the session's model calls cost so far: the newest of its record and its events. */
  spent() {
    const read = this.record.total_cost_usd;
    if (read == null) return this.totalCost ?? null;
    return Math.max(read, this.totalCost ?? 0);
  }

  setRecord(record) {
    this.record = record;
    this.newUsage = this.newUsage.filter((u) => u.seq > record.last_seq);
    // A record read before the newest events arrived must not take the state back.
    if (record.last_seq >= (this.feed?.lastSeq ?? 0)) this.setState(record.state);
    drawHeader(this);
  }

  setState(state) {
    this.state = state;
    list.setState(this.id, state);
    drawHeader(this);
    updateControls();
  }
}

/** "1 message", "3 tool calls". */
function plural(n, what) {
  return `${count(n)} ${what}${n === 1 ? "" : "s"}`;
}

/**
 * The open session's title and figures: the messages and tool calls the page has drawn (the
 * system prompt is not one a person sees), and the tokens used as of the newest event.
 */
function drawHeader(session) {
  const r = session.record;
  const shown = session.conversation.counts();
  const parts = [`created ${clock(r.created_at)}`, shown.messages ? plural(shown.messages, "message") : "no messages yet"];
  if (shown.calls) parts.push(plural(shown.calls, "tool call"));
  const usage = session.usage();
  if (usage.input_tokens || usage.output_tokens) {
    parts.push(`${count(usage.input_tokens)} in · ${count(usage.output_tokens)} out tokens`);
  }
  const spent = session.spent();
  const priced = spent != null || r.max_cost_usd != null;
  show(ui.spend, priced);
  if (priced) {
    const cap = r.max_cost_usd != null ? ` of ${usd(r.max_cost_usd)} cap` : "";
    setText(ui.spend, `${usd(spent ?? 0)} spent${cap}`);
    ui.spend.classList.toggle("over", r.max_cost_usd != null && (spent ?? 0) >= r.max_cost_usd);
  }
  setText(ui.title, r.title || "Untitled session");
  setText(ui.meta, parts.join(" · "));
  if (session.drawnAgent !== r.agent) {
    session.drawnAgent = r.agent;
    drawSessionAgent(ui.agent, r.agent);
  }
  // A run a budget stopped leaves the session failed, and resumable once the cap is raised.
  const paused = session.state === "failed" && r.last_run?.id === r.last_run_id && r.last_run?.finish_reason === "budget";
  setText(ui.state, paused ? "paused (budget)" : session.state.replace("_", " "));
  ui.state.dataset.state = paused ? "paused" : session.state;
  const title = `${r.title || "Session"} · tah`;
  if (document.title !== title) document.title = title;
}

/** Sets an element's text when it changed (the header is drawn again every frame events come). */
function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

function updateControls() {
  if (!open) return;
  const state = open.state;
  const active = state === "running" || state === "waiting_tool";
  const waiting = open.conversation.waitingCalls().length > 0;
  show(ui.cancel, active);
  show(ui.resume, state === "failed" || state === "cancelled");
  ui.compact.disabled = active;
  ui.remove.disabled = active;
  // While calls wait for an answer a new message denies them; otherwise one run at a time.
  ui.send.disabled = state === "running" || (state === "waiting_tool" && !waiting);
  ui.send.textContent = state === "waiting_tool" && waiting ? "Send (deny waiting)" : "Send";
}

async function openSession(id) {
  if (open?.id === id) return;
  open?.stop();
  open = null;
  setBanner(null);
  list.select(id);
  closeSidebar();
  let record;
  try {
    record = await sessions.get(id);
  } catch (error) {
    if (error.status === 401) return;
    toast(error.status === 404 ? "That session does not exist." : error.message, "error");
    location.hash = "#/";
    return;
  }
  open = new OpenSession(record);
  view("session");
  drawHeader(open);
  updateControls();
  loadArtifacts(open);
  await open.begin();
}

function showWelcome() {
  open?.stop();
  open = null;
  setBanner(null);
  list.select(null);
  ui.title.textContent = "tah";
  ui.meta.textContent = "";
  document.title = "tah";
  view("welcome");
}

function showAgents(id) {
  open?.stop();
  open = null;
  setBanner(null);
  list.select(null);
  closeSidebar();
  document.title = "Agents · tah";
  view("agents");
  return agentsPage.show(isAgentId(id) ? id : null);
}

async function route() {
  const session = location.hash.match(/^#\/s\/([^/]+)$/);
  const agent = location.hash.match(/^#\/agents(?:\/([^/]+))?$/);
  if (session && isId(session[1])) await openSession(session[1]);
  else if (agent) await showAgents(agent[1]);
  else showWelcome();
}

window.addEventListener("hashchange", route);

// ---- actions -----------------------------------------------------------------------------

async function act(button, work) {
  button.disabled = true;
  try {
    return await work();
  } catch (error) {
    if (error.status !== 401) toast(error.message, "error");
    return undefined;
  } finally {
    button.disabled = false;
    updateControls();
  }
}

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});

async function send() {
  const text = ui.input.value;
  if (!open || !text.trim() || ui.send.disabled) return;
  const session = open;
  const pendingDeny = session.state === "waiting_tool";
  await act(ui.send, async () => {
    await sessions.run(session.id, text, pendingDeny);
    if (open === session) {
      ui.input.value = "";
      autosize();
    }
  });
}

ui.input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});

function autosize() {
  ui.input.rows = Math.min(10, Math.max(1, ui.input.value.split("\n").length));
}
ui.input.addEventListener("input", autosize);

ui.cancel.addEventListener("click", () => act(ui.cancel, () => sessions.cancel(open.id)));
ui.resume.addEventListener("click", () => act(ui.resume, () => sessions.resume(open.id)));
ui.compact.addEventListener("click", () =>
  act(ui.compact, async () => {
    const result = await sessions.compact(open.id);
    if (!result) toast("Nothing to compact yet.", "info");
  }),
);

async function forkAt(session, turns, text) {
  try {
    const fork = await sessions.fork(session.id, turns);
    await list.refresh();
    location.hash = `#/s/${fork.id}`;
    ui.input.value = text;
    autosize();
    ui.input.focus();
    toast("Forked before that message: edit it and send to try again.", "info");
  } catch (error) {
    if (error.status !== 401) toast(error.message, "error");
  }
}

ui.remove.addEventListener("click", async () => {
  if (!open) return;
  const session = open;
  $("confirm-text").textContent = `Delete “${session.record.title || "Untitled session"}” and its whole history?`;
  const dialog = $("confirm-dialog");
  dialog.returnValue = "";
  dialog.showModal();
  dialog.addEventListener(
    "close",
    () => {
      if (dialog.returnValue !== "yes") return;
      act(ui.remove, async () => {
        await sessions.remove(session.id);
        toast("Session deleted.", "info");
        location.hash = "#/";
        await list.refresh();
      });
    },
    { once: true },
  );
});

// New session.
const newDialog = $("new-session-dialog");
function newSession() {
  $("new-session-form").reset();
  $("new-session-error").hidden = true;
  newDialog.showModal();
  $("new-title").focus();
  fillAgentPicker($("new-agent")).catch(() => {});
}
$("new-session").addEventListener("click", newSession);
$("welcome-new").addEventListener("click", newSession);
$("new-session-cancel").addEventListener("click", () => newDialog.close());
$("new-session-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const title = $("new-title").value.trim();
  const prompt = $("new-prompt").value.trim();
  const agent = $("new-agent").value;
  const body = {};
  if (title) body.title = title;
  // The default agent is the one a session gets without `agent`.
  if (agent) body.agent = agent;
  if (prompt) body.system_prompt = prompt;
  try {
    const record = await sessions.create(body);
    newDialog.close();
    await list.refresh();
    location.hash = `#/s/${record.id}`;
    ui.input.focus();
  } catch (error) {
    $("new-session-error").textContent = error.message;
    $("new-session-error").hidden = false;
  }
});

// Artifacts (the routes may not exist on this server: then the button stays hidden).
async function loadArtifacts(session) {
  if (!artifactsRoute) return;
  try {
    const page = await sessions.artifacts(session.id);
    if (open !== session) return;
    const items = page?.data ?? [];
    ui.artifactsToggle.hidden = false;
    ui.artifactsToggle.textContent = `Files (${items.length})`;
    clear(ui.artifactList);
    for (const a of items) {
      if (!isId(a.id)) continue;
      ui.artifactList.append(
        h(
          "li",
          {},
          h("a", { href: sessions.artifactUrl(session.id, a.id), download: (a.path ?? "file").split("/").pop(), text: a.path ?? a.id }),
          h("span", { class: "muted small", text: ` v${a.version ?? 1} · ${a.media_type ?? ""}` }),
        ),
      );
    }
    if (!items.length) ui.artifactList.append(h("li", { class: "muted", text: "No files yet." }));
  } catch (error) {
    if (error instanceof ApiError && (error.status === 404 || error.status === 405)) {
      // The session was just read, so a 404 means this server has no artifact routes.
      artifactsRoute = false;
      ui.artifactsToggle.hidden = true;
      show(ui.artifacts, false);
    }
  }
}

ui.artifactsToggle.addEventListener("click", () => {
  const visible = ui.artifacts.hidden;
  show(ui.artifacts, visible);
  ui.artifactsToggle.setAttribute("aria-expanded", String(visible));
});

// Inspector.
function setInspector(visible) {
  show(ui.inspector, visible);
  ui.inspectorToggle.setAttribute("aria-expanded", String(visible));
  ui.app.classList.toggle("inspecting", visible);
  inspector.setOpen(visible);
}
ui.inspectorToggle.addEventListener("click", () => setInspector(ui.inspector.hidden));
$("inspector-close").addEventListener("click", () => {
  setInspector(false);
  ui.inspectorToggle.focus();
});

// The sidebar on narrow screens.
function closeSidebar() {
  ui.app.classList.remove("sidebar-open");
}
$("sidebar-open").addEventListener("click", () => {
  ui.app.classList.add("sidebar-open");
  $("new-session").focus();
});
$("sidebar-close").addEventListener("click", closeSidebar);
// A click beside the open sidebar (on the dimmed page) closes it.
document.addEventListener("click", (event) => {
  if (ui.app.classList.contains("sidebar-open") && !ui.sidebar.contains(event.target) && !event.target.closest("#sidebar-open")) {
    closeSidebar();
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  if (ui.app.classList.contains("sidebar-open")) closeSidebar();
  else if (!ui.inspector.hidden) setInspector(false);
});

// ---- start -------------------------------------------------------------------------------

/** Where a session token given in the address is kept: this tab only. */
const TOKEN_KEY = "tah:session-token";

/**
 * The session token the page was opened with (`#/s/<id>?token=tahs_…`), moved out of the
 * address (so it is not left in the history or shown) into this tab's storage; `null` when
 * the page was not opened with one.
 */
function takeSessionToken() {
  const given = location.hash.match(/^#\/s\/([^/?]+)\?token=(tahs_[0-9a-f]{64})$/);
  if (given && isId(given[1])) {
    sessionStorage.setItem(TOKEN_KEY, JSON.stringify({ id: given[1], token: given[2] }));
    history.replaceState(null, "", `#/s/${given[1]}`);
  }
  try {
    const kept = JSON.parse(sessionStorage.getItem(TOKEN_KEY) || "null");
    return kept && location.hash === `#/s/${kept.id}` ? kept : null;
  } catch {
    return null;
  }
}

async function start() {
  const token = takeSessionToken();
  if (token) {
    // One session, by its token: no sign-in, no list, no agents page (the token reaches
    // none of them).
    useSessionToken(token.token);
    ui.app.dataset.mode = "session-token";
    ui.signOut.hidden = true;
    ui.sidebar.hidden = true;
    ui.agentsLink.hidden = true;
    await route();
    return;
  }
  let status = { required: false, signed_in: false };
  try {
    status = await auth.status();
  } catch (error) {
    // An older server without the route: carry on; a 401 later shows the form.
  }
  authRequired = Boolean(status?.required);
  if (authRequired && !status.signed_in) {
    showSignIn();
    return;
  }
  ui.signOut.hidden = !authRequired;
  await list.start();
  performance.mark("tah:list");
  await route();
  performance.mark("tah:ready");
}

// For tests and the rendering benchmark: what the page has drawn, and a way to feed it events
// as the stream does. It holds nothing secret.
window.tah = {
  get conversation() {
    return open?.conversation ?? null;
  },
  get feed() {
    return open?.feed ?? null;
  },
  inspector,
  Conversation,
  api,
};

start();
