// The session list in the sidebar: title, state, when it last changed and the agent it runs (when
// not the default); refreshed every few seconds while the page is visible.

import { h, clear, ago, isId } from "./dom.js";
import { sessions } from "./api.js";

const REFRESH_MS = 4000;

export class SessionList {
  constructor(list, empty, { onError }) {
    this.list = list;
    this.empty = empty;
    this.onError = onError;
    this.current = null;
    this.items = [];
    this.timer = null;
    this.loaded = false;
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") this.refresh();
    });
  }

  start() {
    clearInterval(this.timer);
    this.timer = setInterval(() => {
      if (document.visibilityState === "visible") this.refresh();
    }, REFRESH_MS);
    return this.refresh();
  }

  stop() {
    clearInterval(this.timer);
  }

  async refresh() {
    try {
      const page = await sessions.list();
      this.items = (page?.data ?? []).filter((s) => isId(s.id));
      this.loaded = true;
      this.draw();
    } catch (error) {
      if (error.status !== 401) this.onError?.(error);
    }
    return this.items;
  }

  select(id) {
    this.current = id;
    this.draw();
  }

  /** Updates one session's state in place (from its own events) until the next refresh. */
  setState(id, state) {
    const item = this.items.find((s) => s.id === id);
    if (item && item.state !== state) {
      item.state = state;
      item.updated_at = new Date().toISOString();
      this.draw();
    }
  }

  draw() {
    clear(this.list);
    this.empty.hidden = this.items.length > 0 || !this.loaded;
    for (const s of this.items) {
      const title = s.title || "Untitled session";
      const link = h(
        "a",
        {
          class: "session-link",
          href: `#/s/${s.id}`,
          "aria-current": s.id === this.current ? "page" : null,
        },
        h("span", { class: "session-name", text: title }),
        h(
          "span",
          { class: "session-line" },
          h("span", { class: `dot state-${s.state}`, "aria-hidden": "true" }),
          h("span", { text: s.state.replace("_", " ") }),
          h("span", { class: "muted", text: ` · ${ago(s.updated_at)}` }),
          s.parent_id ? h("span", { class: "muted", text: " · fork" }) : null,
          s.agent?.name && s.agent.id !== "default" ? h("span", { class: "muted" }, " · ", h("span", { dir: "auto", text: s.agent.name })) : null,
        ),
      );
      this.list.append(h("li", {}, link));
    }
  }
}
