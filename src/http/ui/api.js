// The HTTP API as the page uses it: JSON in and out, problem+json errors as `ApiError`, and
// the sign-in cookie (sent by the browser; the page never sees the token once signed in).

/** An error answer: its status and the problem's `type` and `detail`. */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.type = (problem?.type || "").replace("urn:tah:problem:", "");
    this.problem = problem;
  }
}

/**
 * A session token (`tahs_…`, made by `POST /v1/sessions/{id}/tokens`) the page was opened
 * with: sent as `Authorization: Bearer` on every request instead of the sign-in cookie. It is
 * kept in this tab's sessionStorage only.
 */
let sessionToken = null;

/** Uses `token` for every request from now on (`null`: the sign-in cookie again). */
export function useSessionToken(token) {
  sessionToken = token;
}

/** The headers that authenticate a request made with a session token (none otherwise). */
export function authHeaders() {
  return sessionToken ? { authorization: `Bearer ${sessionToken}` } : {};
}

/** Listeners of `unauthorized` (any 401: the page shows its sign-in form). */
export const authEvents = new EventTarget();

/**
 * `method path` with an optional JSON body; resolves to the parsed JSON (or null for 204),
 * rejects with `ApiError` for an error status or `TypeError` when the server is unreachable.
 */
export async function api(method, path, body) {
  const init = {
    method,
    headers: { accept: "application/json", ...authHeaders() },
    credentials: "same-origin",
  };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { detail: text };
    }
  }
  if (!response.ok) {
    if (response.status === 401) authEvents.dispatchEvent(new Event("unauthorized"));
    throw new ApiError(response.status, data);
  }
  return data;
}

const base = (id) => `/v1/sessions/${encodeURIComponent(id)}`;

/** Every item of a paged list (`{data, next_cursor}`), following `cursor` (or `after`). */
export async function allPages(path, param = "cursor", limit = 200, most = 20000) {
  const items = [];
  let cursor = null;
  for (;;) {
    const sep = path.includes("?") ? "&" : "?";
    const query = `${sep}limit=${limit}${cursor ? `&${param}=${encodeURIComponent(cursor)}` : ""}`;
    const page = await api("GET", path + query);
    items.push(...(page?.data ?? []));
    cursor = page?.next_cursor;
    if (!cursor || items.length >= most) return items;
  }
}

export const sessions = {
  list: (limit = 100) => api("GET", `/v1/sessions?limit=${limit}`),
  get: (id) => api("GET", base(id)),
  create: (body) => api("POST", "/v1/sessions", body),
  remove: (id) => api("DELETE", base(id)),
  messages: (id) => allPages(`${base(id)}/messages`, "after"),
  firstEvents: (id, limit) => api("GET", `${base(id)}/events?limit=${limit}`),
  step: (id, stepId) => api("GET", `${base(id)}/steps/${encodeURIComponent(stepId)}`),
  run: (id, input, pendingDeny) =>
    api("POST", `${base(id)}/runs${pendingDeny ? "?pending=deny" : ""}`, { input }),
  resume: (id) => api("POST", `${base(id)}/resume`),
  cancel: (id) => api("POST", `${base(id)}/cancel`),
  compact: (id) => api("POST", `${base(id)}/compact`),
  fork: (id, turns) => api("POST", `${base(id)}/fork`, { turns }),
  approve: (id, callId, decision, reason) =>
    api("POST", `${base(id)}/approvals/${encodeURIComponent(callId)}`, {
      decision,
      ...(reason ? { reason } : {}),
    }),
  toolResult: (id, callId, output, isError) =>
    api("POST", `${base(id)}/tool-results/${encodeURIComponent(callId)}`, {
      output,
      is_error: Boolean(isError),
    }),
  artifacts: (id) => api("GET", `${base(id)}/artifacts`),
  artifactUrl: (id, artifactId) =>
    `${base(id)}/artifacts/${encodeURIComponent(artifactId)}/content`,
  eventsUrl: (id) => `${base(id)}/events`,
};

const agentBase = (id) => `/v1/agents/${encodeURIComponent(id)}`;

export const agents = {
  /** The stored agents, archived ones included, newest first (the default agent is not one). */
  list: () => allPages("/v1/agents?include_archived=true"),
  /** An agent's latest version; `default` is the one the server's flags define. */
  get: (id) => api("GET", agentBase(id)),
  /** Every version of an agent, newest first. */
  versions: (id) => allPages(`${agentBase(id)}/versions`),
};

/** The model providers agents name (`GET /v1/providers`): names, types, base URLs; never a key. */
export const providers = () => api("GET", "/v1/providers");

export const auth = {
  status: () => api("GET", "/v1/auth/cookie"),
  signIn: (token) => api("POST", "/v1/auth/cookie", { token }),
  signOut: () => api("DELETE", "/v1/auth/cookie"),
};
