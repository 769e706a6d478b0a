// The agents as the page shows them: the choice of agent in "New session" (the default agent and
// the stored ones, by name and model), the agent a session runs in its header, and the agents
// page (`#/agents`, `#/agents/<id>`): every agent with its model, version and whether it is
// archived, the model providers they may name, and one agent's versions with what each one
// changed. Read-only: agents are made and
// changed through the API. Names, prompts and every other field are put in as text, like
// everything else that came from the server.

import { h, append, clear, ago, clock, isId } from "./dom.js";
import { agents, providers } from "./api.js";
import { lineDiff, diffView } from "./diff.js";

/** The id of the agent the server's flags define. */
export const DEFAULT_AGENT = "default";

/** True for what an agent link may name: the default agent or a UUID. */
export function isAgentId(value) {
  return value === DEFAULT_AGENT || isId(value);
}

/** The fields of a version the page shows and compares, in this order, with their labels. */
const FIELDS = [
  ["model", "Model"],
  ["name", "Name"],
  ["description", "Description"],
  ["system_prompt", "System prompt"],
  ["tools", "Tools"],
  ["mcp_servers", "MCP servers"],
  ["tool_policy", "Tool policy"],
  ["client_tools", "Client tools"],
  ["subagents", "Sub-agents"],
  ["max_steps", "Max steps"],
  ["context_chars", "Context characters"],
  ["thinking_budget", "Thinking budget"],
  ["max_tokens", "Max tokens"],
  ["max_run_tokens", "Max tokens a run"],
  ["max_cost_usd", "Max cost (USD)"],
  ["metadata", "Metadata"],
];
const LABELS = new Map(FIELDS);
/** What identifies or dates a version rather than configures it (`provider` follows `model`). */
const NOT_COMPARED = new Set(["id", "version", "created_at", "updated_at", "archived_at", "provider", "follows_latest"]);
/** Longer values, or values of several lines, are shown as blocks and compared line by line. */
const INLINE_MAX = 80;

/** True for a list of names (tools, MCP servers, sub-agents). */
const isNames = (value) => Array.isArray(value) && value.every((v) => typeof v === "string");

/** A field's value as text to compare: a list of names one a line, anything else as JSON. */
function valueText(value) {
  if (value === undefined || value === null) return "";
  if (typeof value === "string") return value;
  // An empty list (no tools) is not an absent one (every tool).
  if (isNames(value)) return value.length ? value.join("\n") : "(none)";
  if (typeof value === "object" && !Array.isArray(value) && !Object.keys(value).length) return "";
  return JSON.stringify(value, null, 2);
}

/** A field's value in a line of text, when it fits in one. */
function inlineText(value) {
  if (isNames(value)) {
    const text = value.length ? value.join(", ") : "(none)";
    return text.length <= INLINE_MAX ? text : null;
  }
  const text = valueText(value);
  return text.includes("\n") || text.length > INLINE_MAX ? null : text;
}

/** The configuring fields of the given versions: the known ones in order, then any other. */
function fieldsOf(...versions) {
  const keys = FIELDS.map(([key]) => key);
  for (const version of versions) {
    for (const key of Object.keys(version ?? {})) {
      if (!NOT_COMPARED.has(key) && !keys.includes(key)) keys.push(key);
    }
  }
  return keys;
}

const label = (key) => LABELS.get(key) ?? key;

/** The fields whose value differs between two versions of an agent. */
export function changedFields(before, after) {
  return fieldsOf(before, after).filter((key) => valueText(before?.[key]) !== valueText(after?.[key]));
}

/** "name · model": how an agent is named in a list. */
export function agentLabel(agent) {
  return agent.model ? `${agent.name} · ${agent.model}` : agent.name;
}

/**
 * Fills `select` with the agents a new session may run: the default agent first (its value is
 * empty: a session created without `agent` runs it), then the stored ones not archived. Sets
 * `data-loaded` when done. Resolves to the agents listed.
 */
export async function fillAgentPicker(select) {
  delete select.dataset.loaded;
  const [fallback, stored] = await Promise.allSettled([agents.get(DEFAULT_AGENT), agents.list()]);
  const chosen = select.value;
  const listed = [];
  clear(select);
  const base = fallback.status === "fulfilled" ? fallback.value : { name: DEFAULT_AGENT };
  select.append(h("option", { value: "", text: `${agentLabel(base)} (the server's)` }));
  if (stored.status === "fulfilled") {
    for (const agent of stored.value) {
      if (!isId(agent.id) || agent.archived_at) continue;
      listed.push(agent);
      select.append(h("option", { value: agent.id, text: agentLabel(agent) }));
    }
  }
  if (listed.some((a) => a.id === chosen)) select.value = chosen;
  select.dataset.loaded = "true";
  return listed;
}

/** The header's link to the agent a session runs: its name and version. */
export function drawSessionAgent(link, agent) {
  clear(link);
  link.hidden = !agent?.name;
  if (link.hidden) return;
  link.href = isAgentId(agent.id) ? `#/agents/${agent.id}` : "#/agents";
  const follows = agent.follows_latest ? ", following its latest version" : "";
  link.title = `Agent ${agent.name}, version ${agent.version}${follows}`;
  append(link, [
    h("span", { class: "agent-name", dir: "auto", text: agent.name }),
    h("span", { class: "agent-version", text: `v${agent.version}` }),
    agent.follows_latest ? h("span", { class: "agent-follows", text: "latest" }) : null,
  ]);
}

/** The agents page: the list on one side, the chosen agent and its versions on the other. */
export class AgentsPage {
  /** `onHeader(title, meta)` sets the top bar; `onError(error)` reports a failure. */
  constructor(list, detail, providerList, { onHeader, onError }) {
    this.listEl = list;
    this.providerEl = providerList;
    this.detailEl = detail;
    this.onHeader = onHeader;
    this.onError = onError;
    this.items = [];
    this.fallback = null;
    this.current = null;
    /** Bumped on each `show`, so that an answer to an earlier one is dropped. */
    this.shown = 0;
  }

  /** Shows the list, and the agent `id` (or none). */
  async show(id) {
    const turn = ++this.shown;
    this.current = isAgentId(id) ? id : null;
    const [fallback, stored, named] = await Promise.allSettled([agents.get(DEFAULT_AGENT), agents.list(), providers()]);
    if (turn !== this.shown) return;
    this.drawProviders(named.status === "fulfilled" ? named.value?.data ?? [] : []);
    this.fallback = fallback.status === "fulfilled" ? fallback.value : null;
    this.items = stored.status === "fulfilled" ? stored.value.filter((a) => isId(a.id)) : [];
    if (stored.status === "rejected") this.failed(stored.reason);
    this.drawList();
    if (this.current) await this.showAgent(this.current, turn);
    else this.drawEmpty();
  }

  failed(error) {
    if (error?.status !== 401) this.onError?.(error);
  }

  drawList() {
    clear(this.listEl);
    const archived = this.items.filter((a) => a.archived_at).length;
    const total = this.items.length + (this.fallback ? 1 : 0);
    this.onHeader(
      "Agents",
      `${total} agent${total === 1 ? "" : "s"}${archived ? ` · ${archived} archived` : ""}`,
    );
    const all = this.fallback ? [this.fallback, ...this.items] : this.items;
    for (const agent of all) {
      const link = h(
        "a",
        { class: "agent-link", href: `#/agents/${agent.id}`, "aria-current": agent.id === this.current ? "page" : null },
        h("span", { class: "agent-title" }, h("span", { class: "agent-name", dir: "auto", text: agent.name }), archivedBadge(agent)),
        h(
          "span",
          { class: "agent-line" },
          h("span", { class: "agent-model", text: agent.model ?? "" }),
          h("span", { text: `v${agent.version}` }),
          agent.id === DEFAULT_AGENT
            ? h("span", { text: "the server's flags" })
            : h("span", { title: agent.updated_at, text: `updated ${ago(agent.updated_at)}` }),
        ),
      );
      this.listEl.append(h("li", {}, link));
    }
  }

  /** The providers: name, type and base URL (the default one is the flags'). */
  drawProviders(items) {
    clear(this.providerEl);
    const heading = document.getElementById(this.providerEl.getAttribute("aria-labelledby"));
    if (heading) heading.hidden = !items.length;
    for (const p of items) {
      this.providerEl.append(
        h(
          "li",
          { class: "provider", dataset: { name: p.name } },
          h("span", { class: "provider-name", text: p.name }),
          h("span", { class: "muted", text: [p.type, p.base_url].filter(Boolean).join(" · ") }),
        ),
      );
    }
  }

  drawEmpty() {
    clear(this.detailEl);
    const text = this.items.length
      ? "Choose an agent to see its configuration and its versions."
      : "No agents are stored yet: create one with POST /v1/agents. Sessions run the default agent, which the server's flags define.";
    this.detailEl.append(h("p", { class: "muted agent-hint", text }));
  }

  /** Reads one agent and its versions, and draws them. */
  async showAgent(id, turn) {
    clear(this.detailEl);
    this.detailEl.append(h("p", { class: "muted", text: "Loading…" }));
    let agent;
    let versions;
    try {
      // The default agent has one version, the flags as they are now.
      [agent, versions] = await Promise.all([
        agents.get(id),
        id === DEFAULT_AGENT ? Promise.resolve(null) : agents.versions(id),
      ]);
    } catch (error) {
      if (turn !== this.shown) return;
      clear(this.detailEl);
      const text = error.status === 404 ? "That agent does not exist." : `Could not read the agent: ${error.message}`;
      this.detailEl.append(h("p", { class: "error-text", text }));
      return;
    }
    if (turn !== this.shown) return;
    this.drawAgent(agent, versions ?? [agent]);
  }

  drawAgent(agent, versions) {
    clear(this.detailEl);
    this.detailEl.append(
      h(
        "header",
        { class: "agent-head" },
        h("h2", { class: "agent-heading" }, h("span", { class: "agent-name", dir: "auto", text: agent.name }), archivedBadge(agent)),
        agent.description ? h("p", { class: "agent-description", text: agent.description }) : null,
        h(
          "p",
          { class: "muted small agent-facts" },
          h("span", { text: `version ${agent.version}` }),
          agent.provider ? h("span", { text: `provider ${agent.provider}` }) : null,
          agent.created_at ? h("span", { title: agent.created_at, text: `created ${ago(agent.created_at)}` }) : null,
          agent.archived_at ? h("span", { title: agent.archived_at, text: `archived ${ago(agent.archived_at)}` }) : null,
          h("code", { class: "agent-id", text: agent.id }),
        ),
      ),
      h("h3", { class: "agent-section", text: `Configuration (version ${agent.version})` }),
      configuration(agent),
      h("h3", { class: "agent-section", text: `Versions (${versions.length})` }),
      h(
        "ol",
        { class: "agent-versions" },
        versions.map((version, i) => versionItem(version, versions[i + 1])),
      ),
    );
  }
}

/** "archived", for an archived agent. */
function archivedBadge(agent) {
  return agent.archived_at ? h("span", { class: "archived-badge", title: `archived ${agent.archived_at}`, text: "archived" }) : null;
}

/** A version's every field that has a value, as a definition list. */
function configuration(agent) {
  const list = h("dl", { class: "agent-config" });
  for (const key of fieldsOf(agent)) {
    // No tool list means every tool the server offers, which is worth saying; other absent fields
    // are not shown.
    if (key === "tools" && (agent.tools === undefined || agent.tools === null)) {
      list.append(h("dt", { text: label(key) }), h("dd", { class: "muted", text: "every tool the server offers" }));
      continue;
    }
    if (!valueText(agent[key])) continue;
    const inline = inlineText(agent[key]);
    list.append(
      h("dt", { text: label(key) }),
      h("dd", {}, inline !== null ? h("span", { class: `value value-${key}`, text: inline }) : h("pre", { class: "io value", text: valueText(agent[key]) })),
    );
  }
  return list;
}

/** One version: its number and date, and what it changed from the one before. */
function versionItem(version, before) {
  const item = h(
    "li",
    { class: "agent-version-item", dataset: { version: String(version.version) } },
    h(
      "div",
      { class: "version-head" },
      h("span", { class: "version-number", text: `v${version.version}` }),
      h("span", { class: "muted small", title: version.updated_at, text: `${clock(version.updated_at)} · ${ago(version.updated_at)}` }),
    ),
  );
  if (!before && version.version !== 1) {
    item.append(h("p", { class: "muted small version-note", text: "The oldest version listed." }));
    return item;
  }
  // The first version is what the agent was created with: its fields, as set from nothing.
  if (!before) item.append(h("p", { class: "muted small version-note", text: "Created." }));
  const changed = changedFields(before ?? {}, version).filter((key) => before || key !== "name");
  if (!changed.length && before) item.append(h("p", { class: "muted small version-note", text: "No field changed." }));
  const list = h("ul", { class: "changes" });
  for (const key of changed) list.append(change(key, before?.[key], version[key]));
  item.append(list);
  return item;
}

/**
 * One changed field: a list of names as the names it gained and lost, a short value as old → new,
 * a longer one as a line diff.
 */
function change(key, before, after) {
  const row = h("li", { class: "change", dataset: { field: key } }, h("span", { class: "change-field", text: label(key) }));
  if (isNames(before) && isNames(after)) {
    const added = after.filter((name) => !before.includes(name));
    const removed = before.filter((name) => !after.includes(name));
    for (const name of added) row.append(" ", h("ins", { class: "change-new", title: "added", text: `+ ${name}` }));
    for (const name of removed) row.append(" ", h("del", { class: "change-old change-name", title: "removed", text: `− ${name}` }));
    if (!added.length && !removed.length) row.append(" reordered: ", h("ins", { class: "change-new", text: inlineText(after) ?? after.join(", ") }));
    return row;
  }
  const old = valueText(before);
  const now = valueText(after);
  const oldLine = inlineText(before);
  const nowLine = inlineText(after);
  if (oldLine !== null && nowLine !== null) {
    if (!old) row.append(" set to ", h("ins", { class: "change-new", text: nowLine }));
    else if (!now) row.append(" cleared (was ", h("del", { class: "change-old", text: oldLine }), ")");
    else row.append(" ", h("del", { class: "change-old", text: oldLine }), " → ", h("ins", { class: "change-new", text: nowLine }));
  } else {
    row.append(diffView(lineDiff(old, now)));
  }
  return row;
}
