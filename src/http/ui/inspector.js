// The raw event inspector: every event of the session as it arrived (seq, type, time), its
// data viewable as JSON. Rows are built only while the panel is open, a frame's worth at a
// time, so a long log costs nothing until someone looks at it.

import { h, clear, pretty, clock } from "./dom.js";

/** Rows drawn per frame while catching up. */
const ROWS_PER_FRAME = 400;

export class Inspector {
  constructor(list, hideStream) {
    this.list = list;
    this.hideStream = hideStream;
    this.events = [];
    this.drawn = 0;
    this.open = false;
    this.scheduled = false;
    hideStream.addEventListener("change", () => this.redraw());
  }

  reset() {
    this.events = [];
    this.redraw();
  }

  push(events) {
    for (const event of events) this.events.push(event);
    this.schedule();
  }

  setOpen(open) {
    this.open = open;
    this.schedule();
  }

  redraw() {
    clear(this.list);
    this.drawn = 0;
    this.schedule();
  }

  schedule() {
    if (!this.open || this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      this.draw();
    });
  }

  draw() {
    const hide = this.hideStream.checked;
    const end = Math.min(this.events.length, this.drawn + ROWS_PER_FRAME);
    const rows = [];
    for (; this.drawn < end; this.drawn++) {
      const event = this.events[this.drawn];
      if (hide && event.type.endsWith("-stream")) continue;
      rows.push(row(event));
    }
    const stick = this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 40;
    this.list.append(...rows);
    if (stick) this.list.scrollTop = this.list.scrollHeight;
    if (this.drawn < this.events.length) this.schedule();
  }
}

function row(event) {
  const data = h("pre", { class: "event-data" });
  const details = h(
    "details",
    { class: "event" },
    h(
      "summary",
      {},
      h("span", { class: "event-seq", text: String(event.seq) }),
      h("span", { class: `event-type ${family(event.type)}`, text: event.type }),
      h("span", { class: "event-time muted", text: clock(event.created_at) }),
    ),
    data,
  );
  // The JSON is made when the row is opened.
  details.addEventListener("toggle", () => {
    if (details.open && !data.textContent) data.textContent = pretty(event.data);
  });
  return h("li", { dataset: { seq: String(event.seq) } }, details);
}

function family(type) {
  return `type-${type.split(".")[0]}`;
}
