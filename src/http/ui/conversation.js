// The conversation of one session, drawn from its event log as the events arrive: runs, user
// messages, assistant replies as they stream (markdown, drawn by `markdown.js`), thinking
// (collapsed), one card per tool call updated in place by its call id (with approval and
// client-result forms, a diff for the file tools, its output unfolded when short),
// artifacts, sub-agents, usage per run, and copy buttons on messages.
//
// Events are queued and applied once per animation frame, within a time budget, so a burst
// (a replay of a long log, a fast model) costs one layout per frame however many events it
// holds; streamed text reaches each reply once per frame. A streaming reply is redrawn as
// markdown at most for a fifth of the time it streams (a redraw costs in proportion to the
// reply's length); text that arrives in between is shown as it came until the next redraw.
// Model output only ever enters the page as text nodes, or as elements `markdown.js` made.

import { h, append, clear, pretty, brief, clock, count, usd, bytes, duration, isId, copyButton } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { lineDiff, diffStats, diffView } from "./diff.js";

/** Milliseconds of event handling per frame before the rest waits for the next frame. */
const FRAME_BUDGET_MS = 12;
/** After a markdown redraw that took t ms, the next waits at least this many times t. */
const REDRAW_WAIT_FACTOR = 4;
/** A tool's output this short is shown unfolded. */
const SHORT_OUTPUT = { lines: 12, chars: 1200 };

/** What a card's status is called. */
const STATUS_LABEL = {
  pending: "pending",
  approval: "needs approval",
  client: "waiting for the client",
  running: "running",
  done: "done",
  error: "error",
  denied: "denied",
};

export class Conversation {
  /**
   * `root`: the element to draw into; `actions`: what the buttons do —
   * `approve(callId, decision, reason)`, `toolResult(callId, output, isError)`,
   * `fork(turns, text)`, `request(stepId)` (resolves to the step with its request).
   */
  constructor(root, actions) {
    this.root = root;
    this.actions = actions;
    this.history = h("div", { class: "history" });
    this.live = h("div", { class: "live" });
    clear(root);
    append(root, [this.history, this.live]);
    this.queue = [];
    this.scheduled = false;
    this.applied = 0;
    this.lastSeq = 0;
    this.userTurns = 0;
    this.runs = new Map();
    this.run = null;
    this.blocks = new Map();
    this.cards = new Map();
    this.dirty = new Set();
    this.pending = new Set();
    /** What the page last saw written to each path (for the file tools' diffs). */
    this.files = new Map();
    /** Messages and tool calls drawn: live, and copied from a fork's parent. */
    this.shown = { messages: 0, calls: 0 };
    this.copied = { messages: 0, calls: 0 };
    this.onFlush = null;
    this.stopped = false;
  }

  stop() {
    this.stopped = true;
  }

  /** Queues events (in seq order) to be drawn at the next frame. */
  push(events) {
    for (const event of events) this.queue.push(event);
    this.schedule();
  }

  schedule() {
    if (this.scheduled || this.stopped) return;
    this.scheduled = true;
    requestAnimationFrame(() => this.flush());
  }

  flush() {
    this.scheduled = false;
    if (this.stopped) return;
    const scroller = this.root.closest(".conversation") ?? this.root;
    const stick = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 80;
    const started = performance.now();
    let done = 0;
    while (done < this.queue.length && performance.now() - started < FRAME_BUDGET_MS) {
      const event = this.queue[done++];
      try {
        this.apply(event);
      } catch (error) {
        console.error("could not draw event", event, error);
      }
      this.lastSeq = event.seq;
      this.applied += 1;
    }
    this.queue.splice(0, done);
    for (const block of this.dirty) block.flushText();
    this.dirty.clear();
    if (stick) scroller.scrollTop = scroller.scrollHeight;
    if (this.queue.length) this.schedule();
    this.onFlush?.(this);
  }

  /** Waiting approvals and client requests (their call ids). */
  waitingCalls() {
    return [...this.pending];
  }

  /** What a person sees: messages (theirs and the replies with text) and tool calls. */
  counts() {
    return {
      messages: this.shown.messages + this.copied.messages,
      calls: this.shown.calls + this.copied.calls,
    };
  }

  // ---- events ------------------------------------------------------------------------------

  apply(event) {
    const d = event.data ?? {};
    switch (event.type) {
      case "session.created":
        this.note(`Session created ${clock(event.created_at)}`, "quiet");
        break;
      case "session.forked":
        this.note(
          `Forked from another session${Number.isInteger(d.turns) ? ` after ${d.turns} turn(s)` : ""}`,
          "quiet",
          isId(d.parent_id) ? h("a", { href: `#/s/${d.parent_id}`, text: "open the original" }) : null,
        );
        break;
      case "agent.started":
        this.startRun(d.run_id, d.kind, event.created_at);
        break;
      case "user.message":
        this.userMessage(d.message?.content ?? "", this.container());
        this.shown.messages += 1;
        break;
      case "llm.started":
        this.block(d.step_id);
        break;
      case "agent.assistant-stream":
        this.block(d.step_id).stream(d.text ?? "");
        this.dirty.add(this.block(d.step_id));
        break;
      case "agent.thinking-stream":
        this.block(d.step_id).thinkingStream(d.text ?? "");
        this.dirty.add(this.block(d.step_id));
        break;
      case "llm.completed":
        this.llmCompleted(d);
        break;
      case "llm.retry":
        this.block(d.step_id).notice(`Retrying (attempt ${d.attempt}): ${d.error}`, "warn");
        break;
      case "llm.failed":
        this.block(d.step_id).fail(d.error);
        break;
      case "tool.started": {
        const card = this.card(d.call?.id, d.step_id);
        card.describe(d.call?.name, d.call?.arguments);
        card.setStatus("running");
        break;
      }
      case "tool.finished":
        this.card(d.call_id, d.step_id).finish(d.output, d.is_error);
        this.pending.delete(d.call_id);
        break;
      case "tool.approval-requested": {
        const card = this.card(d.call_id, d.step_id);
        card.describe(d.tool, d.input, d.subject);
        card.askApproval(d.expires_at, (decision, reason) =>
          this.actions.approve(d.call_id, decision, reason),
        );
        this.pending.add(d.call_id);
        break;
      }
      case "tool.approval-resolved":
        this.card(d.call_id).resolved(d.decision, d.by, d.reason);
        this.pending.delete(d.call_id);
        break;
      case "tool.client-requested": {
        const card = this.card(d.call_id, d.step_id);
        card.describe(d.tool, d.input);
        card.askClient(d.expires_at, (output, isError) =>
          this.actions.toolResult(d.call_id, output, isError),
        );
        this.pending.add(d.call_id);
        break;
      }
      case "tool.policy-updated":
        this.note(
          `Rule added: ${d.rule?.action ?? "allow"} ${d.rule?.tool ?? "?"}${d.rule?.match ? ` for ${d.rule.match}` : ""}`,
          "quiet",
        );
        break;
      case "artifact.created":
        this.artifact(d.artifact ?? {});
        break;
      case "subagent.started":
        this.card(d.call_id).subagent(d.session_id, "running");
        break;
      case "subagent.finished":
        this.card(d.call_id).subagent(d.session_id, d.status);
        break;
      case "agent.context.trimmed":
        this.note(
          `Context trimmed to fit ${count(d.budget)} characters (${count(d.chars?.before)} → ${count(d.chars?.after)}): ` +
            `${d.dropped_turns} turn(s) left out, ${d.elided_tool_results} tool output(s) omitted`,
          "quiet",
        );
        break;
      case "agent.context.compacted":
        this.note(
          `${d.auto ? "Compacted automatically" : "Compacted"}: ${d.turns} turn(s) summarised (${count(d.chars)} characters)`,
          "info",
        );
        break;
      case "agent.context.compact-failed":
        this.note(`Compaction failed: ${d.error}`, "warn");
        break;
      case "agent.finished":
        this.endRun(d.run_id, event.created_at, "finished", d);
        break;
      case "agent.failed":
        this.endRun(d.run_id, event.created_at, "failed", d);
        break;
      case "agent.cancelled":
        this.endRun(d.run_id, event.created_at, "cancelled", d);
        break;
      default:
        // session.state, storage.checkpoint and types this page does not know: the
        // inspector shows them.
        break;
    }
  }

  /** Where items of the current run go. */
  container() {
    return this.run?.body ?? this.live;
  }

  note(text, tone, ...extra) {
    const more = extra.filter(Boolean);
    this.container().append(h("p", { class: `note ${tone ?? ""}` }, text, more.length ? " · " : null, ...more));
  }

  startRun(runId, kind, at) {
    const header = h(
      "div",
      { class: "run-head" },
      h("span", { class: "run-kind", text: kind === "resume" ? "Resumed run" : "Run" }),
      h("span", { class: "muted", text: clock(at) }),
    );
    const body = h("div", { class: "run-body" });
    const footer = h("div", { class: "run-foot", role: "status" });
    const el = h("section", { class: "run running", dataset: { runId: runId ?? "" } }, header, body, footer);
    this.live.append(el);
    const run = { el, body, footer, startedAt: Date.parse(at) };
    this.runs.set(runId, run);
    this.run = run;
  }

  endRun(runId, at, how, d) {
    const run = this.runs.get(runId) ?? this.run;
    if (!run) return;
    run.el.classList.remove("running");
    run.el.classList.add(how);
    const took = duration(Date.parse(at) - run.startedAt);
    const parts = [];
    if (how === "finished" && d.finish_reason === "budget") {
      // A cap (tokens or money) paused the run: the session is resumed once it is raised.
      run.el.classList.add("paused");
      parts.push(h("strong", { text: "Paused" }));
      parts.push(h("span", { class: "pill", text: "budget" }));
      parts.push(h("span", { class: "budget-hint", text: "a budget was reached: raise the cap and resume" }));
    } else if (how === "finished") {
      parts.push(h("strong", { text: "Finished" }));
      if (d.finish_reason) parts.push(h("span", { class: "pill", text: d.finish_reason }));
    } else if (how === "failed") {
      parts.push(h("strong", { text: d.error === "interrupted" ? "Interrupted" : "Failed" }));
      if (d.error && d.error !== "interrupted") parts.push(h("span", { class: "error-text", text: d.error }));
    } else {
      parts.push(h("strong", { text: "Cancelled" }));
    }
    if (d.usage) {
      parts.push(
        h("span", {
          class: "usage",
          title: "tokens sent to and received from the model in this run",
          text: `${count(d.usage.input_tokens)} in · ${count(d.usage.output_tokens)} out tokens`,
        }),
      );
    }
    if (took) parts.push(h("span", { class: "muted", text: took }));
    clear(run.footer);
    append(run.footer, parts);
    for (const block of this.blocks.values()) if (block.el.classList.contains("streaming") && run.body.contains(block.el)) block.settle();
    if (this.run === run) this.run = null;
  }

  userMessage(text, where) {
    const turns = this.userTurns++;
    const retry = h("button", {
      class: "link-button small fork-turn",
      type: "button",
      text: "Retry from here",
      "aria-label": "Retry from here: fork the session before this message",
      onclick: () => this.actions.fork(turns, text),
    });
    where.append(
      h(
        "div",
        { class: "message user", dataset: { turn: String(turns) } },
        h("div", { class: "bubble", text }),
        h("div", { class: "message-tools" }, copyButton(() => text, "Copy this message"), retry),
      ),
    );
  }

  block(stepId, where) {
    let block = this.blocks.get(stepId);
    if (!block) {
      block = new AssistantBlock(stepId, this.actions);
      this.blocks.set(stepId, block);
      (where ?? this.container()).append(block.el);
    }
    return block;
  }

  llmCompleted(d) {
    const block = this.block(d.step_id);
    const message = d.message ?? {};
    block.complete(message.content ?? "", thinkingText(message.thinking), d.usage, d.finish_reason, d.cost_usd);
    if (message.content) this.shown.messages += 1;
    this.shown.calls += (message.tool_calls ?? []).length;
    for (const call of message.tool_calls ?? []) {
      const card = this.card(call.id, d.step_id);
      card.describe(call.name, call.arguments);
    }
  }

  card(callId, stepId) {
    let card = this.cards.get(callId);
    if (!card) {
      card = new ToolCard(callId, this.files);
      this.cards.set(callId, card);
      const block = stepId ? this.blocks.get(stepId) : null;
      (block ? block.tools : this.container()).append(card.el);
    }
    return card;
  }

  artifact(a) {
    const link = isId(a.id) && this.actions.artifactUrl
      ? h("a", { href: this.actions.artifactUrl(a.id), download: basename(a.path), text: "Download" })
      : null;
    this.container().append(
      h(
        "div",
        { class: "artifact" },
        h("span", { class: "artifact-icon", "aria-hidden": "true" }),
        h("span", { class: "artifact-path", text: a.path ?? "file" }),
        h("span", { class: "muted small", text: [a.version ? `v${a.version}` : "", a.size != null ? bytes(a.size) : "", a.media_type ?? ""].filter(Boolean).join(" · ") }),
        link,
      ),
    );
  }

  // ---- history inherited by a fork ---------------------------------------------------------

  /** Draws the messages a fork copied from its parent, before its own events. */
  renderHistory(messages) {
    clear(this.history);
    this.copied = { messages: 0, calls: 0 };
    if (!messages.length) return;
    this.history.append(h("p", { class: "note quiet", text: "Copied from the original session" }));
    const results = new Map();
    for (const m of messages) if (m.role === "tool" && m.tool_call_id) results.set(m.tool_call_id, m);
    for (const m of messages) {
      if (m.role === "user") {
        this.userMessage(m.content, this.history);
        this.copied.messages += 1;
      } else if (m.role === "assistant") {
        const block = new AssistantBlock(null, this.actions);
        this.history.append(block.el);
        block.complete(m.content, thinkingText(m.thinking));
        if (m.content) this.copied.messages += 1;
        this.copied.calls += (m.tool_calls ?? []).length;
        for (const call of m.tool_calls ?? []) {
          const card = new ToolCard(call.id, this.files);
          block.tools.append(card.el);
          card.describe(call.name, call.arguments);
          const result = results.get(call.id);
          if (result) card.finish(result.content, /^\{"error"/.test(result.content ?? ""));
        }
      } else if (m.role === "system" && (m.content ?? "").startsWith("[Summary")) {
        this.history.append(
          h("details", { class: "summary" }, h("summary", { text: "Summary of the earlier conversation" }), h("pre", { text: m.content })),
        );
      }
    }
  }
}

/** One model reply: thinking (collapsed), text as it streams, the calls it made. */
class AssistantBlock {
  constructor(stepId, actions) {
    this.stepId = stepId;
    /** The reply's text as the model wrote it (markdown). */
    this.source = "";
    this.pendingText = "";
    this.pendingThinking = "";
    this.thinking = null;
    /** Text that arrived since the last markdown redraw, shown as it came. */
    this.tail = null;
    this.nextDraw = 0;
    this.drawTimer = null;
    this.body = h("div", { class: "assistant-text md" });
    this.meta = h("div", { class: "assistant-meta muted small" });
    this.tools = h("div", { class: "tool-cards" });
    this.el = h("div", { class: "message assistant streaming" }, this.body, this.tools, this.meta);
    this.actions = actions;
  }

  stream(text) {
    this.pendingText += text;
  }

  thinkingStream(text) {
    this.pendingThinking += text;
  }

  thinkingBox() {
    if (!this.thinking) {
      this.thinkingText = document.createTextNode("");
      this.thinking = h(
        "details",
        { class: "thinking" },
        h("summary", { text: "Thinking" }),
        h("div", { class: "thinking-text" }, this.thinkingText),
      );
      this.el.prepend(this.thinking);
    }
    return this.thinkingText;
  }

  flushText() {
    if (this.pendingText) {
      this.source += this.pendingText;
      if (performance.now() >= this.nextDraw) this.draw();
      else this.showAsItCame(this.pendingText);
      this.pendingText = "";
    }
    if (this.pendingThinking) {
      this.thinkingBox().appendData(this.pendingThinking);
      this.pendingThinking = "";
    }
  }

  /** Redraws the whole reply as markdown, and waits in proportion to what that cost. */
  draw() {
    clearTimeout(this.drawTimer);
    this.drawTimer = null;
    const started = performance.now();
    this.body.replaceChildren(renderMarkdown(this.source));
    this.tail = null;
    const now = performance.now();
    this.nextDraw = now + (now - started) * REDRAW_WAIT_FACTOR;
  }

  /**
   * Shows a piece of text at the end of the last block drawn, as it came, until the next
   * redraw (which is due when the stream pauses, at the latest).
   */
  showAsItCame(piece) {
    if (!this.tail) {
      const blocks = this.body.querySelectorAll("p, li, pre code, th, td, h3, h4, h5, h6");
      this.tail = document.createTextNode(trailingSpace(this.source, this.source.length - piece.length));
      (blocks[blocks.length - 1] ?? this.body).append(h("span", { class: "md-tail" }, this.tail));
    }
    this.tail.appendData(piece);
    if (!this.drawTimer) {
      this.drawTimer = setTimeout(() => this.draw(), Math.max(0, this.nextDraw - performance.now()));
    }
  }

  /** The reply is over (its run ended without a completed step): the last redraw, now. */
  settle() {
    this.el.classList.remove("streaming");
    if (this.tail || this.drawTimer) this.draw();
  }

  complete(text, thinking, usage, finishReason, costUsd) {
    this.pendingText = "";
    this.pendingThinking = "";
    this.source = text ?? "";
    this.draw();
    this.el.classList.toggle("empty", !text);
    if (thinking) this.thinkingBox().data = thinking;
    this.el.classList.remove("streaming");
    clear(this.meta);
    if (text) this.meta.append(copyButton(() => this.source, "Copy this reply"));
    if (usage) {
      append(this.meta, [
        h("span", { text: `${count(usage.input_tokens)} in · ${count(usage.output_tokens)} out` }),
        costUsd != null ? h("span", { class: "step-cost", title: "what this model call cost", text: ` · ${usd(costUsd)}` }) : null,
        finishReason ? h("span", { text: ` · ${finishReason}` }) : null,
      ]);
    }
    if (this.stepId && this.actions.request) {
      const details = h("details", { class: "request" }, h("summary", { text: "Request" }));
      let loaded = false;
      details.addEventListener("toggle", async () => {
        if (!details.open || loaded) return;
        loaded = true;
        const pre = h("pre", { text: "Loading…" });
        details.append(pre);
        try {
          const step = await this.actions.request(this.stepId);
          pre.textContent = pretty(step?.request ?? step);
        } catch (error) {
          pre.textContent = `Could not load the request: ${error.message}`;
        }
      });
      this.meta.append(details);
    }
  }

  notice(text, tone) {
    this.el.insertBefore(h("p", { class: `note ${tone}`, text }), this.tools);
  }

  fail(error) {
    this.el.classList.remove("streaming");
    this.notice(`The model call failed: ${error}`, "error");
  }
}

/** One tool call, drawn once and updated as its events arrive. */
class ToolCard {
  /** `files`: what the page last saw written to each path, shared by the cards. */
  constructor(callId, files) {
    this.callId = callId;
    this.files = files;
    this.name = h("span", { class: "tool-name", text: "tool" });
    this.subject = h("span", { class: "tool-subject" });
    this.badge = h("span", { class: "badge" });
    this.input = h("pre", { class: "io" });
    this.output = h("pre", { class: "io" });
    this.inputBox = h("details", { class: "tool-io" }, h("summary", { text: "Input" }), this.input);
    this.outputBox = h("details", { class: "tool-io", hidden: true }, h("summary", { text: "Output" }), this.output);
    this.extra = h("div", { class: "tool-extra" });
    this.el = h(
      "article",
      { class: "tool-card", dataset: { callId: callId ?? "" }, "aria-label": "Tool call" },
      h("header", { class: "tool-head" }, this.name, this.subject, this.badge),
      this.extra,
      this.inputBox,
      this.outputBox,
    );
    this.setStatus("pending");
  }

  setStatus(status) {
    if (this.status === "done" || this.status === "error") return;
    this.status = status;
    this.el.dataset.status = status;
    this.badge.textContent = STATUS_LABEL[status] ?? status;
  }

  describe(name, input, subject) {
    if (name) {
      this.name.textContent = name;
      this.el.setAttribute("aria-label", `Tool call ${name}`);
    }
    if (input !== undefined) {
      this.input.textContent = pretty(input);
      this.args = parsed(input);
    }
    const what = subject ?? subjectOf(input);
    if (what) this.subject.textContent = brief(what, 90);
    if (!this.diffBox && this.args) this.showDiff(this.name.textContent, this.args);
  }

  /** `write_file` and `edit_file` calls: what they change, as a diff. */
  showDiff(tool, args) {
    const path = typeof args.path === "string" ? args.path : null;
    let before;
    let after;
    let title;
    if (tool === "edit_file" && typeof args.old_string === "string" && typeof args.new_string === "string") {
      // The whole file's lines around the edit when the page knows the file; else the strings.
      const known = path ? this.files.get(path) : undefined;
      const whole = known?.includes(args.old_string) ? known : undefined;
      before = whole ?? args.old_string;
      after = whole === undefined ? args.new_string : edit(whole, args);
      title = args.replace_all === true ? "Changes (every occurrence)" : "Changes";
    } else if (tool === "write_file" && path && typeof args.content === "string") {
      before = this.files.get(path) ?? "";
      after = args.content;
      title = this.files.has(path) ? "Changes" : "New content";
    } else {
      return;
    }
    const rows = lineDiff(before, after);
    const { added, removed } = diffStats(rows);
    this.diffBox = h(
      "details",
      { class: "tool-io tool-diff", open: true },
      h("summary", null, title, " ", h("span", { class: "diff-added", text: `+${added}` }), " ", h("span", { class: "diff-removed", text: `−${removed}` })),
      diffView(rows),
    );
    this.inputBox.before(this.diffBox);
  }

  finish(output, isError) {
    const text = pretty(output ?? "");
    this.output.textContent = text;
    this.outputBox.hidden = false;
    this.outputBox.open = isShort(text);
    this.clearForm();
    this.setStatus(isError ? "error" : "done");
    if (!isError) this.remember();
  }

  /** After a file tool succeeded: what the page now knows the file holds. */
  remember() {
    const args = this.args;
    const path = typeof args?.path === "string" ? args.path : null;
    if (!path) return;
    const tool = this.name.textContent;
    if (tool === "write_file" && typeof args.content === "string") this.files.set(path, args.content);
    else if (tool === "edit_file" && this.files.has(path) && typeof args.old_string === "string" && typeof args.new_string === "string") {
      this.files.set(path, edit(this.files.get(path), args));
    }
  }

  clearForm() {
    this.form?.remove();
    this.form = null;
  }

  askApproval(expiresAt, answer) {
    this.setStatus("approval");
    this.clearForm();
    const reason = h("input", {
      class: "reason",
      type: "text",
      placeholder: "Reason (optional, sent to the model on deny)",
      "aria-label": "Reason for the decision",
      maxlength: "2000",
    });
    const error = h("p", { class: "error-text small", role: "alert", hidden: true });
    const buttons = [];
    const decide = (decision) => async () => {
      for (const b of buttons) b.disabled = true;
      error.hidden = true;
      try {
        await answer(decision, reason.value.trim());
      } catch (e) {
        error.textContent = e.message;
        error.hidden = false;
        for (const b of buttons) b.disabled = false;
      }
    };
    buttons.push(
      h("button", { class: "button primary small", type: "button", text: "Allow once", onclick: decide("allow") }),
      h("button", { class: "button small", type: "button", text: "Always allow", title: "Allow this tool with this subject for the rest of the session", onclick: decide("always") }),
      h("button", { class: "button danger small", type: "button", text: "Deny", onclick: decide("deny") }),
    );
    this.form = h(
      "div",
      { class: "approval", role: "group", "aria-label": "Approve this call" },
      h("p", { class: "approval-question" }, "The agent wants to run this call.", expiresAt ? h("span", { class: "muted small", text: ` Expires ${clock(expiresAt)}.` }) : null),
      h("div", { class: "approval-row" }, reason, ...buttons),
      error,
    );
    if (!this.diffBox) this.inputBox.open = true;
    this.extra.append(this.form);
  }

  resolved(decision, by, reason) {
    this.clearForm();
    const runs = decision === "allow" || decision === "always";
    const who = by && by !== "user" ? ` (${by})` : "";
    const label = { allow: "Allowed once", always: "Always allowed", deny: "Denied" }[decision] ?? decision;
    this.extra.append(h("p", { class: `resolution ${runs ? "ok" : "no"}`, text: `${label}${who}${reason ? `: ${reason}` : ""}` }));
    if (!runs) this.setStatus("denied");
    else this.setStatus("running");
  }

  askClient(expiresAt, submit) {
    this.setStatus("client");
    this.clearForm();
    const output = h("textarea", { class: "client-output", rows: "3", "aria-label": "The tool's result", placeholder: "The result the model will see" });
    const isError = h("input", { type: "checkbox" });
    const error = h("p", { class: "error-text small", role: "alert", hidden: true });
    const send = h("button", { class: "button primary small", type: "submit", text: "Send result" });
    this.form = h(
      "form",
      {
        class: "client-form",
        "aria-label": "Send this tool's result",
        onsubmit: async (event) => {
          event.preventDefault();
          send.disabled = true;
          error.hidden = true;
          try {
            await submit(output.value, isError.checked);
          } catch (e) {
            error.textContent = e.message;
            error.hidden = false;
            send.disabled = false;
          }
        },
      },
      h("p", { class: "approval-question" }, "This tool runs in the client: give its result.", expiresAt ? h("span", { class: "muted small", text: ` Expires ${clock(expiresAt)}.` }) : null),
      output,
      h("div", { class: "approval-row" }, h("label", { class: "small" }, isError, " it failed (an error result)"), send),
      error,
    );
    this.inputBox.open = true;
    this.extra.append(this.form);
  }

  subagent(sessionId, status) {
    this.sub?.remove();
    this.sub = h(
      "p",
      { class: "subagent small" },
      "Sub-agent ",
      isId(sessionId) ? h("a", { href: `#/s/${sessionId}`, text: "open its session" }) : "session",
      ` · ${status ?? "running"}`,
    );
    this.extra.append(this.sub);
  }
}

/** A call's arguments as an object (some providers give them as JSON text), or null. */
function parsed(input) {
  let value = input;
  if (typeof value === "string") {
    try {
      value = JSON.parse(value);
    } catch {
      return null;
    }
  }
  return value && typeof value === "object" && !Array.isArray(value) ? value : null;
}

/** `content` with an `edit_file` call's replacement made. */
function edit(content, args) {
  return args.replace_all === true
    ? content.split(args.old_string).join(args.new_string)
    : content.replace(args.old_string, () => args.new_string);
}

/** Whether a tool's output is short enough to be shown unfolded. */
function isShort(text) {
  if (!text || text.length > SHORT_OUTPUT.chars) return false;
  let lines = 1;
  for (const c of text) if (c === "\n" && ++lines > SHORT_OUTPUT.lines) return false;
  return true;
}

/** The white space `text` ends with before `end`. */
function trailingSpace(text, end) {
  let start = end;
  while (start > 0 && /\s/.test(text[start - 1])) start--;
  return text.slice(start, end);
}

/** What a call is about, in a few words: its path, command or pattern. */
function subjectOf(input) {
  if (!input || typeof input !== "object") return "";
  for (const key of ["command", "path", "pattern", "description", "question", "url"]) {
    if (typeof input[key] === "string" && input[key]) return input[key];
  }
  return brief(input, 90);
}

/** The thinking a message carries, as text, whatever shape the provider gave it. */
function thinkingText(thinking) {
  if (!thinking) return "";
  if (typeof thinking === "string") return thinking;
  if (Array.isArray(thinking)) return thinking.map(thinkingText).filter(Boolean).join("\n\n");
  if (typeof thinking === "object") {
    if (thinking.type === "redacted_thinking") return "(redacted by the provider)";
    return thinking.thinking ?? thinking.text ?? thinking.content ?? "";
  }
  return String(thinking);
}

function basename(path) {
  return String(path ?? "file").split("/").pop() || "file";
}
