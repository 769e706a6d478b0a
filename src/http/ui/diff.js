// Line diffs for the file tools' cards: what an `edit_file` call replaces with what, and what
// a `write_file` call writes (against the content the page last saw written to that path, or
// as added lines when it saw none). Drawn as text nodes, like everything else that came from
// the server.

import { h } from "./dom.js";

/** Above this many line pairs to compare, a changed region is shown as removed then added. */
const MAX_CELLS = 1_000_000;
/** Unchanged runs longer than this are folded, keeping `CONTEXT` lines at each side. */
const CONTEXT = 3;
/** The most lines a diff shows; the call's input has the rest. */
const MAX_LINES = 400;

/** A text's lines (a final line break ends the last line rather than starting one). */
function lines(text) {
  if (!text) return [];
  const all = text.split("\n");
  if (all[all.length - 1] === "") all.pop();
  return all;
}

/** The lines of `before` and `after` as rows `{op: " " | "-" | "+", text}`. */
export function lineDiff(before, after) {
  const a = lines(before);
  const b = lines(after);
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
    endA--;
    endB--;
  }
  const same = (line) => ({ op: " ", text: line });
  return [
    ...a.slice(0, start).map(same),
    ...middle(a.slice(start, endA), b.slice(start, endB)),
    ...a.slice(endA).map(same),
  ];
}

/** The changed region: a longest common subsequence when it is small enough to compute. */
function middle(a, b) {
  const removed = a.map((text) => ({ op: "-", text }));
  const added = b.map((text) => ({ op: "+", text }));
  if (!a.length || !b.length || a.length * b.length > MAX_CELLS) return [...removed, ...added];
  const width = b.length + 1;
  const table = new Uint32Array((a.length + 1) * width);
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      table[i * width + j] =
        a[i] === b[j] ? table[(i + 1) * width + j + 1] + 1 : Math.max(table[(i + 1) * width + j], table[i * width + j + 1]);
    }
  }
  const rows = [];
  let i = 0;
  let j = 0;
  while (i < a.length && j < b.length) {
    if (a[i] === b[j]) {
      rows.push({ op: " ", text: a[i] });
      i++;
      j++;
    } else if (table[(i + 1) * width + j] >= table[i * width + j + 1]) {
      rows.push(removed[i++]);
    } else {
      rows.push(added[j++]);
    }
  }
  return [...rows, ...removed.slice(i), ...added.slice(j)];
}

/** How many lines a diff adds and removes. */
export function diffStats(rows) {
  let added = 0;
  let removed = 0;
  for (const row of rows) {
    if (row.op === "+") added++;
    else if (row.op === "-") removed++;
  }
  return { added, removed };
}

/** The rows drawn: long unchanged runs folded, at most `MAX_LINES` lines. */
export function diffView(rows) {
  const view = h("pre", { class: "diff" });
  let shown = 0;
  const line = (kind, sign, text) => {
    view.append(h("span", { class: `diff-line ${kind}` }, h("span", { class: "diff-sign", "aria-hidden": "true", text: sign }), `${text}\n`));
    shown++;
  };
  for (let i = 0; i < rows.length; ) {
    if (shown >= MAX_LINES) {
      view.append(h("span", { class: "diff-line skip", text: `… ${rows.length - i} more lines (the input has them all)\n` }));
      break;
    }
    if (rows[i].op !== " ") {
      line(rows[i].op === "+" ? "add" : "del", rows[i].op, rows[i].text);
      i++;
      continue;
    }
    let end = i;
    while (end < rows.length && rows[end].op === " ") end++;
    const keepBefore = i === 0 ? 0 : CONTEXT;
    const keepAfter = end === rows.length ? 0 : CONTEXT;
    if (end - i > keepBefore + keepAfter + 1) {
      for (let k = i; k < i + keepBefore; k++) line("same", " ", rows[k].text);
      view.append(h("span", { class: "diff-line skip", text: `⋯ ${end - i - keepBefore - keepAfter} unchanged lines\n` }));
      for (let k = end - keepAfter; k < end; k++) line("same", " ", rows[k].text);
    } else {
      for (let k = i; k < end; k++) line("same", " ", rows[k].text);
    }
    i = end;
  }
  return view;
}
