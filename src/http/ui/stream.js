// A session's event stream, followed for as long as the page shows the session.
//
// It reads the SSE stream with fetch (so that every event type arrives, whatever its name, and
// an error status is seen as one), and reconnects by itself with `Last-Event-ID` set to the
// last `seq` it passed on: the server replays what came after it. Events are passed on once
// each, in `seq` order: one at or below the last seq passed on is dropped, so a replay that
// overlaps what was seen shows nothing twice.

import { authHeaders } from "./api.js";

/** How long to wait before reconnecting: quick at first, then at most every few seconds. */
const BACKOFF_MS = [250, 500, 1000, 2000, 3000];
/** The server sends a heartbeat every 10 s; this long without a byte means the link is dead. */
const SILENCE_MS = 25000;

export class EventFeed {
  /**
   * `url`: the events route. `onEvents(events)` gets each batch of new events (in order);
   * `onStatus(status, detail)` gets "connecting" | "live" | "reconnecting" | "unauthorized" |
   * "gone".
   */
  constructor(url, { onEvents, onStatus, after = 0 }) {
    this.url = url;
    this.onEvents = onEvents;
    this.onStatus = onStatus;
    this.lastSeq = after;
    this.attempt = 0;
    this.stopped = false;
    this.controller = null;
    this.timer = null;
    this.run();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    this.controller?.abort();
  }

  /** Reconnects at once (after a sign-in, or when the user asks). */
  retryNow() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.controller?.abort();
    this.attempt = 0;
    this.run();
  }

  async run() {
    if (this.stopped) return;
    const controller = new AbortController();
    this.controller = controller;
    this.onStatus(this.attempt ? "reconnecting" : "connecting");
    let silence = null;
    const touch = () => {
      clearTimeout(silence);
      silence = setTimeout(() => controller.abort(), SILENCE_MS);
    };
    try {
      touch();
      const response = await fetch(this.url, {
        headers: {
          accept: "text/event-stream",
          "last-event-id": String(this.lastSeq),
          ...authHeaders(),
        },
        credentials: "same-origin",
        signal: controller.signal,
        cache: "no-store",
      });
      if (response.status === 401) {
        clearTimeout(silence);
        this.onStatus("unauthorized");
        return;
      }
      if (response.status === 404) {
        clearTimeout(silence);
        this.onStatus("gone");
        return;
      }
      if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
      this.attempt = 0;
      this.onStatus("live");
      await this.read(response.body, touch);
      // The server ended the stream (it is shutting down): reconnect.
    } catch (error) {
      if (this.stopped) return;
    } finally {
      clearTimeout(silence);
    }
    if (this.stopped) return;
    const wait = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    this.attempt += 1;
    this.onStatus("reconnecting");
    this.timer = setTimeout(() => this.run(), wait);
  }

  /** Reads SSE frames until the body ends, passing on events in batches per chunk. */
  async read(body, touch) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      touch();
      buffer += value;
      const batch = [];
      let start = 0;
      let end;
      // Frames end with a blank line; the server writes "\n" line ends.
      while ((end = buffer.indexOf("\n\n", start)) >= 0) {
        const event = parseFrame(buffer.slice(start, end));
        start = end + 2;
        if (event && event.seq > this.lastSeq) {
          this.lastSeq = event.seq;
          batch.push(event);
        }
      }
      buffer = buffer.slice(start);
      if (batch.length) this.onEvents(batch);
    }
  }
}

/** The event in one SSE frame (its `data:` lines), or null for a comment or `retry:`. */
export function parseFrame(frame) {
  let data = "";
  let hasData = false;
  for (const line of frame.split("\n")) {
    if (line.startsWith("data:")) {
      data += (hasData ? "\n" : "") + line.slice(line.startsWith("data: ") ? 6 : 5);
      hasData = true;
    }
  }
  if (!hasData) return null;
  try {
    const event = JSON.parse(data);
    return Number.isInteger(event?.seq) ? event : null;
  } catch {
    return null;
  }
}
