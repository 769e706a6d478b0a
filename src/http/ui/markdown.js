// Markdown as model replies use it, drawn as DOM nodes: headings, paragraphs, emphasis (strong,
// em, strikethrough), inline code, fenced code blocks (with a copy button), block quotes,
// nested lists, tables, thematic breaks and links. Nothing is parsed as HTML: raw HTML in the
// text stays text, and every node is made with `createElement` or as a text node.
//
// A link keeps only an http(s) or relative address (anything else, `javascript:` say, leaves
// the whole link as text) and opens in a new tab with `rel="noopener noreferrer"`; an image is
// drawn as a link to its address, never loaded. Nesting is bounded (blocks and inline both),
// and the parse is linear in the length of the text, so a hostile reply (an emphasis bomb, a
// list 10,000 deep) costs what its length costs.

import { h, copyButton } from "./dom.js";

/** How deep block quotes and lists nest; deeper content is shown as plain text. */
const MAX_BLOCK_DEPTH = 12;
/** How deep emphasis nests; deeper markers stay as text. */
const MAX_INLINE_DEPTH = 16;
/** The most elements one text makes; a text that needs more is shown as plain text. */
const MAX_ELEMENTS = 8000;
/** How many columns a table keeps. */
const MAX_COLUMNS = 64;
/** The longest link address read, and how deep its parentheses may nest. */
const MAX_DESTINATION = 4096;
const MAX_PARENS = 32;

/** `text` as markdown: a fragment of elements and text nodes. */
export function renderMarkdown(text) {
  const source = String(text ?? "");
  const lines = source.replace(/\r\n?/g, "\n").split("\n").map(expandTabs);
  made = 0;
  const fragment = document.createDocumentFragment();
  try {
    blocks(fragment, lines, 0);
    return fragment;
  } catch (error) {
    if (error !== TOO_MANY) throw error;
    const plain = document.createDocumentFragment();
    plain.append(h("p", { class: "md-flat", text: source }));
    return plain;
  }
}

/** Thrown when a text would make more than `MAX_ELEMENTS` elements. */
const TOO_MANY = new Error("too many elements");
/** Elements made by the current `renderMarkdown`. */
let made = 0;

/** `h()`, counted against `MAX_ELEMENTS`. */
function el(tag, props, ...children) {
  made += 1;
  if (made > MAX_ELEMENTS) throw TOO_MANY;
  return h(tag, props, ...children);
}

/** The address a link may have (http, https or relative), or null. */
export function safeHref(raw) {
  const url = String(raw ?? "");
  // Browsers drop tabs and line breaks inside addresses ("java\nscript:"): none is accepted.
  if (!url || /[\u0000-\u0020\u007f]/.test(url)) return null;
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(url);
  if (scheme && !/^https?$/i.test(scheme[1])) return null;
  try {
    const resolved = new URL(url, document.baseURI);
    return resolved.protocol === "http:" || resolved.protocol === "https:" ? url : null;
  } catch {
    return null;
  }
}

// ---- blocks ------------------------------------------------------------------------------

function expandTabs(line) {
  if (!line.startsWith("\t") && !line.startsWith(" \t") && !line.startsWith("  \t") && !line.startsWith("   \t")) {
    return line;
  }
  let column = 0;
  let i = 0;
  for (; i < line.length && (line[i] === " " || line[i] === "\t"); i++) {
    column = line[i] === "\t" ? column + 4 - (column % 4) : column + 1;
  }
  return " ".repeat(column) + line.slice(i);
}

const isBlank = (line) => line.trim() === "";

function indentOf(line) {
  let n = 0;
  while (line.charCodeAt(n) === 32) n++;
  return n;
}

const FENCE = /^( {0,3})(`{3,}|~{3,})(.*)$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(?=[ \t]|$)/;

/** A fence that opens a code block: its indent, marker and info (language). */
function fenceOpen(line) {
  const m = FENCE.exec(line);
  if (!m || (m[2][0] === "`" && m[3].includes("`"))) return null;
  return { indent: m[1].length, marker: m[2], info: m[3].trim() };
}

function fenceCloses(line, open) {
  const text = line.trim();
  return indentOf(line) < 4 && text.length >= open.marker.length && /^(`+|~+)$/.test(text) && text[0] === open.marker[0];
}

/** `# Title` → [level, text]. */
function heading(line) {
  const m = /^ {0,3}(#{1,6})(?=[ \t]|$)/.exec(line);
  if (!m) return null;
  let text = line.slice(m[0].length).trim();
  // A closing run of #s goes, when a space comes before it (or it is all there is).
  let end = text.length;
  while (end > 0 && text[end - 1] === "#") end--;
  if (end === 0) text = "";
  else if (end < text.length && (text[end - 1] === " " || text[end - 1] === "\t")) text = text.slice(0, end).trimEnd();
  return [m[1].length, text];
}

function isRule(line) {
  if (indentOf(line) > 3) return false;
  const text = line.trim();
  const c = text[0];
  if (c !== "-" && c !== "*" && c !== "_") return false;
  let marks = 0;
  for (const ch of text) {
    if (ch === c) marks++;
    else if (ch !== " " && ch !== "\t") return false;
  }
  return marks >= 3;
}

/** A list item's marker: whether ordered, its kind (which lists it continues), start, offset. */
function item(line) {
  const m = ITEM.exec(line);
  if (!m) return null;
  const marker = m[2];
  const after = line.slice(m[0].length);
  const spaces = indentOf(after.replace(/^\t/, " "));
  const blank = isBlank(after);
  const gap = blank ? 1 : spaces > 4 ? 1 : spaces;
  const ordered = /\d/.test(marker[0]);
  return {
    ordered,
    kind: ordered ? marker.slice(-1) : marker,
    start: ordered ? Number.parseInt(marker, 10) : 1,
    offset: m[0].length + gap,
    rest: blank ? "" : after.slice(gap),
  };
}

/** Splits a table row into cells (an escaped `\|` is a pipe inside a cell). */
function cells(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
  const out = [];
  let cell = "";
  for (let i = 0; i < text.length; i++) {
    if (text[i] === "\\" && text[i + 1] === "|") {
      cell += "|";
      i++;
    } else if (text[i] === "|") {
      out.push(cell.trim());
      cell = "";
    } else {
      cell += text[i];
    }
  }
  out.push(cell.trim());
  return out;
}

/** The alignments of a table's delimiter row (`| :--- | :-: |`), or null if it is not one. */
function delimiterRow(line) {
  if (!line || !line.includes("-") || indentOf(line) > 3) return null;
  const parts = cells(line);
  const aligns = [];
  for (const part of parts) {
    if (!/^:?-+:?$/.test(part)) return null;
    const left = part.startsWith(":");
    const right = part.endsWith(":");
    aligns.push(left && right ? "center" : right ? "right" : left ? "left" : "");
  }
  return aligns;
}

/** Whether a table starts at line `i`: a row with pipes, then a matching delimiter row. */
function tableAt(lines, i) {
  const head = lines[i];
  if (!head.includes("|") || indentOf(head) > 3) return null;
  const aligns = delimiterRow(lines[i + 1]);
  return aligns && cells(head).length === aligns.length ? aligns : null;
}

/** Whether line `i` starts a block other than a paragraph (so a paragraph ends before it). */
function startsBlock(lines, i) {
  const line = lines[i];
  return Boolean(
    fenceOpen(line) || heading(line) || isRule(line) || QUOTE.test(line) || item(line) || tableAt(lines, i),
  );
}

/** Draws `lines` as blocks into `parent`. */
function blocks(parent, lines, depth) {
  if (depth >= MAX_BLOCK_DEPTH) {
    parent.append(el("p", { class: "md-flat", text: lines.join("\n").trim() }));
    return;
  }
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) {
      i++;
      continue;
    }
    const fence = fenceOpen(line);
    if (fence) i = codeBlock(parent, lines, i, fence);
    else if (heading(line)) i = headingBlock(parent, line, i);
    else if (isRule(line)) {
      parent.append(el("hr"));
      i++;
    } else if (QUOTE.test(line)) i = quote(parent, lines, i, depth);
    else if (item(line)) i = list(parent, lines, i, depth);
    else if (tableAt(lines, i)) i = table(parent, lines, i, tableAt(lines, i));
    else i = paragraph(parent, lines, i);
  }
}

function codeBlock(parent, lines, i, fence) {
  const body = [];
  let j = i + 1;
  for (; j < lines.length && !fenceCloses(lines[j], fence); j++) {
    const line = lines[j];
    body.push(line.slice(Math.min(fence.indent, indentOf(line))));
  }
  const code = body.join("\n");
  const language = fence.info.split(/\s/)[0];
  parent.append(
    el(
      "div",
      { class: "md-code" },
      el("div", { class: "md-code-head" }, el("span", { class: "md-code-lang", text: language }), copyButton(() => code, "Copy the code")),
      el("pre", null, el("code", { text: code })),
    ),
  );
  return j + 1;
}

function headingBlock(parent, line, i) {
  const [level, text] = heading(line);
  // The page's own headings are h1 and h2: a reply's start at h3.
  const node = el(`h${Math.min(level + 2, 6)}`, { class: `md-h${level}` });
  inline(node, text);
  parent.append(node);
  return i + 1;
}

function paragraph(parent, lines, i) {
  const text = [lines[i].trim()];
  let j = i + 1;
  while (j < lines.length && !isBlank(lines[j]) && !startsBlock(lines, j)) text.push(lines[j++].trim());
  const node = el("p");
  inline(node, text.join("\n"));
  parent.append(node);
  return j;
}

function quote(parent, lines, i, depth) {
  const body = [];
  let j = i;
  while (j < lines.length) {
    const line = lines[j];
    if (QUOTE.test(line)) body.push(line.replace(QUOTE, ""));
    // A paragraph line without the marker continues the quote's paragraph.
    else if (!isBlank(line) && !isBlank(body[body.length - 1]) && !startsBlock(lines, j)) body.push(line);
    else break;
    j++;
  }
  const node = el("blockquote");
  blocks(node, body, depth + 1);
  parent.append(node);
  return j;
}

function list(parent, lines, i, depth) {
  const first = item(lines[i]);
  const node = first.ordered ? el("ol", first.start !== 1 ? { start: String(first.start) } : null) : el("ul");
  let j = i;
  while (j < lines.length) {
    const marker = item(lines[j]);
    if (!marker || marker.ordered !== first.ordered || marker.kind !== first.kind || isRule(lines[j])) break;
    const body = [marker.rest];
    j++;
    while (j < lines.length) {
      const line = lines[j];
      if (isBlank(line)) {
        let k = j;
        while (k < lines.length && isBlank(lines[k])) k++;
        if (k < lines.length && indentOf(lines[k]) >= marker.offset) {
          for (; j < k; j++) body.push("");
          continue;
        }
        break;
      }
      if (indentOf(line) >= marker.offset) body.push(line.slice(marker.offset));
      // A paragraph line that is not indented enough continues the item's last paragraph.
      else if (!isBlank(body[body.length - 1]) && !startsBlock(lines, j)) body.push(line.trim());
      else break;
      j++;
    }
    const li = el("li");
    blocks(li, body, depth + 1);
    node.append(li);
    // The next item of the same list, after blank lines or none.
    let k = j;
    while (k < lines.length && isBlank(lines[k])) k++;
    const next = k < lines.length ? item(lines[k]) : null;
    if (!next || next.kind !== first.kind || next.ordered !== first.ordered || isRule(lines[k])) break;
    j = k;
  }
  parent.append(node);
  return j;
}

function table(parent, lines, i, aligns) {
  const columns = Math.min(aligns.length, MAX_COLUMNS);
  const row = (line, tag) => {
    const tr = el("tr");
    const values = cells(line);
    for (let c = 0; c < columns; c++) {
      const cell = el(tag, aligns[c] ? { class: `md-${aligns[c]}` } : null);
      inline(cell, values[c] ?? "");
      tr.append(cell);
    }
    return tr;
  };
  const body = el("tbody");
  let j = i + 2;
  while (j < lines.length && !isBlank(lines[j]) && lines[j].includes("|") && !startsBlock(lines, j)) {
    body.append(row(lines[j++], "td"));
  }
  parent.append(
    el("div", { class: "md-table" }, el("table", null, el("thead", null, row(lines[i], "th")), body.childElementCount ? body : null)),
  );
  return j;
}

// ---- inline ------------------------------------------------------------------------------

const PUNCTUATION = /[\p{P}\p{S}]/u;
const ESCAPABLE = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

/** Characters that may start something inline; text up to the next one is copied at once. */
const SPECIAL = /[\\`\n*_~[!<hH]/g;
/** An address in angle brackets, read where the scan stands. */
const AUTOLINK = /<(https?:\/\/[^\s<>]{1,4096})>/iy;
/** How a bare address starts. */
const URL_START = /^https?:\/\//i;

const isSpace = (c) => c === undefined || c === " " || c === "\n" || c === "\t" || /\s/.test(c);
const isPunct = (c) => c !== undefined && PUNCTUATION.test(c);

/** Draws `text` as inline markdown into `parent`. */
function inline(parent, text, links = true) {
  build(parent, tokens(text, links));
}

/**
 * The text as tokens: text, line breaks, code spans, links, and runs of `*`, `_` or `~` with
 * what they open and close once emphasis is matched.
 */
function tokens(text, links) {
  const spans = codeSpans(text);
  const brackets = links ? bracketPairs(text, spans) : null;
  const out = [];
  let buffer = "";
  const flush = () => {
    if (buffer) out.push({ type: "text", text: buffer });
    buffer = "";
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === "\\" && ESCAPABLE.includes(text[i + 1] ?? "\0")) {
      buffer += text[i + 1];
      i += 2;
    } else if (c === "\\" && text[i + 1] === "\n") {
      i++;
    } else if (c === "`") {
      const end = spans.get(i);
      let run = 1;
      while (text[i + run] === "`") run++;
      if (end === undefined) {
        buffer += text.slice(i, i + run);
        i += run;
      } else {
        flush();
        out.push({ type: "code", text: codeText(text.slice(i + run, end)) });
        i = end + run;
      }
    } else if (c === "\n") {
      buffer = buffer.trimEnd();
      flush();
      out.push({ type: "br" });
      i++;
      while (text[i] === " ") i++;
    } else if (c === "*" || c === "_" || c === "~") {
      let run = 1;
      while (text[i + run] === c) run++;
      flush();
      out.push(delimiter(text, i, run));
      i += run;
    } else if (links && (c === "[" || (c === "!" && text[i + 1] === "["))) {
      const link = linkAt(text, c === "!" ? i + 1 : i, brackets);
      if (link) {
        flush();
        out.push({ type: "node", node: drawLink(link, c === "!") });
        i = link.end;
      } else {
        buffer += c;
        i++;
      }
    } else if (links && c === "<") {
      AUTOLINK.lastIndex = i;
      const m = AUTOLINK.exec(text);
      const href = m && safeHref(m[1]);
      if (href) {
        flush();
        out.push({ type: "node", node: anchor(href, m[1]) });
        i += m[0].length;
      } else {
        buffer += c;
        i++;
      }
    } else if (links && isUrlStart(text, i)) {
      const url = bareUrl(text, i);
      const href = safeHref(url);
      if (href) {
        flush();
        out.push({ type: "node", node: anchor(href, url) });
        i += url.length;
      } else {
        buffer += c;
        i++;
      }
    } else {
      SPECIAL.lastIndex = i + 1;
      const next = SPECIAL.test(text) ? SPECIAL.lastIndex - 1 : text.length;
      buffer += text.slice(i, next);
      i = next;
    }
  }
  flush();
  matchEmphasis(out);
  return out;
}

/** Code spans: the position of each opening backtick run → the position of its closing run. */
function codeSpans(text) {
  const runs = new Map();
  for (let i = 0; i < text.length; ) {
    if (text[i] === "\\" && ESCAPABLE.includes(text[i + 1] ?? "\0")) {
      i += 2;
      continue;
    }
    if (text[i] !== "`") {
      i++;
      continue;
    }
    let run = 1;
    while (text[i + run] === "`") run++;
    if (!runs.has(run)) runs.set(run, []);
    runs.get(run).push(i);
    i += run;
  }
  const spans = new Map();
  const next = new Map();
  const ordered = [...runs.entries()].flatMap(([len, at]) => at.map((pos) => [pos, len])).sort((a, b) => a[0] - b[0]);
  let after = -1;
  for (const [pos, len] of ordered) {
    if (pos < after) continue;
    const same = runs.get(len);
    let k = next.get(len) ?? 0;
    while (k < same.length && same[k] <= pos) k++;
    next.set(len, k + 1);
    if (k < same.length) {
      spans.set(pos, same[k]);
      after = same[k] + len;
    }
  }
  return spans;
}

/** A code span's text: line breaks as spaces, one space trimmed from each end. */
function codeText(raw) {
  const text = raw.replace(/\n/g, " ");
  return /^ .*[^ ].* $/.test(text) || /^ [^ ] $/.test(text) ? text.slice(1, -1) : text;
}

/** Matching square brackets outside code spans: the position of each `[` → its `]`. */
function bracketPairs(text, spans) {
  const pairs = new Map();
  const open = [];
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "\\") i++;
    else if (c === "`" && spans.has(i)) {
      let run = 1;
      while (text[i + run] === "`") run++;
      i = spans.get(i) + run - 1;
    } else if (c === "[") open.push(i);
    else if (c === "]" && open.length) pairs.set(open.pop(), i);
  }
  return pairs;
}

/** `[label](destination "title")` at `i`: its label, address and end, or null. */
function linkAt(text, i, brackets) {
  const close = brackets.get(i);
  if (close === undefined || text[close + 1] !== "(") return null;
  let j = close + 2;
  while (text[j] === " " || text[j] === "\n") j++;
  let destination = "";
  if (text[j] === "<") {
    const end = scanTo(text, j + 1, ">", "<\n");
    if (end < 0) return null;
    destination = unescape(text.slice(j + 1, end));
    j = end + 1;
  } else {
    let depth = 0;
    const start = j;
    for (; j < text.length && j - start <= MAX_DESTINATION; j++) {
      const c = text[j];
      if (c === "\\" && ESCAPABLE.includes(text[j + 1] ?? "\0")) j++;
      else if (c === "(") {
        if (++depth > MAX_PARENS) return null;
      } else if (c === ")") {
        if (depth === 0) break;
        depth--;
      } else if (isSpace(c) || c < " ") break;
    }
    if (depth !== 0 || j - start > MAX_DESTINATION) return null;
    destination = unescape(text.slice(start, j));
  }
  while (text[j] === " " || text[j] === "\n") j++;
  const quote = { '"': '"', "'": "'", "(": ")" }[text[j]];
  if (quote) {
    const end = scanTo(text, j + 1, quote, "[]\n");
    if (end < 0) return null;
    j = end + 1;
    while (text[j] === " " || text[j] === "\n") j++;
  }
  if (text[j] !== ")") return null;
  return { label: text.slice(i + 1, close), destination, end: j + 1, source: text.slice(i, j + 1) };
}

/**
 * The position of the first unescaped `close` from `i`, or -1 when one of `stops` (or the
 * length limit) comes first: a scan never crosses what would start the next link.
 */
function scanTo(text, i, close, stops) {
  for (let j = i; j < text.length && j - i <= MAX_DESTINATION; j++) {
    const c = text[j];
    if (c === "\\") j++;
    else if (c === close) return j;
    else if (stops.includes(c)) return -1;
  }
  return -1;
}

function unescape(text) {
  return text.replace(/\\([!-/:-@[-`{-~])/g, "$1");
}

/** Whether a bare http(s) address starts at `i` (not inside a word). */
function isUrlStart(text, i) {
  const c = text[i];
  if (c !== "h" && c !== "H") return false;
  return URL_START.test(text.slice(i, i + 8)) && !/[\p{L}\p{N}]/u.test(text[i - 1] ?? " ");
}

/** A bare http(s) address: up to a space, without trailing punctuation or `)`. */
function bareUrl(text, i) {
  let end = i;
  while (end < text.length && end - i < MAX_DESTINATION && !isSpace(text[end]) && text[end] !== "<") end++;
  let url = text.slice(i, end);
  const opened = count(url, "(");
  let closed = count(url, ")");
  for (;;) {
    const last = url[url.length - 1];
    if ("?!.,:;*_~'\"".includes(last)) url = url.slice(0, -1);
    else if (last === ")" && opened < closed) {
      url = url.slice(0, -1);
      closed--;
    } else break;
  }
  return url;
}

function count(text, c) {
  let n = 0;
  for (const ch of text) if (ch === c) n++;
  return n;
}

function anchor(href, label) {
  return el("a", { href, target: "_blank", rel: "noopener noreferrer", text: label });
}

/** A link's element (an image is a link to its address), or its source as text if unsafe. */
function drawLink(link, image) {
  const href = safeHref(link.destination);
  const source = (image ? "!" : "") + link.source;
  if (!href) return document.createTextNode(source);
  if (image) {
    return el("a", { href, target: "_blank", rel: "noopener noreferrer", class: "md-image", text: link.label || link.destination });
  }
  const node = el("a", { href, target: "_blank", rel: "noopener noreferrer" });
  inline(node, link.label, false);
  if (!node.textContent) node.textContent = link.destination;
  return node;
}

/** A run of `*`, `_` or `~`: whether it may open or close emphasis (CommonMark's flanking rules). */
function delimiter(text, i, run) {
  const c = text[i];
  const before = text[i - 1];
  const after = text[i + run];
  const left = !isSpace(after) && (!isPunct(after) || isSpace(before) || isPunct(before));
  const right = !isSpace(before) && (!isPunct(before) || isSpace(after) || isPunct(after));
  let canOpen = left;
  let canClose = right;
  if (c === "_") {
    canOpen = left && (!right || isPunct(before));
    canClose = right && (!left || isPunct(after));
  }
  if (c === "~" && run > 2) canOpen = canClose = false;
  return { type: "delim", char: c, count: run, canOpen, canClose, opens: [], closes: [] };
}

/**
 * Pairs emphasis openers with closers, as CommonMark does: each closer takes the nearest
 * opener of its character, and openers of other characters between the two are dropped. Each
 * opener is pushed and popped once: linear time.
 */
function matchEmphasis(list) {
  const stacks = { "*": [], _: [], "~": [] };
  let matched = 0;
  for (let k = 0; k < list.length; k++) {
    const t = list[k];
    if (t.type !== "delim") continue;
    if (t.canClose) {
      const stack = stacks[t.char];
      while (t.count > 0 && stack.length) {
        const at = stack[stack.length - 1];
        const o = list[at];
        if (t.char === "~" && o.count !== t.count) break;
        const use = t.char === "~" ? t.count : o.count >= 2 && t.count >= 2 ? 2 : 1;
        const kind = t.char === "~" ? "del" : use === 2 ? "strong" : "em";
        const id = ++matched;
        o.opens.push({ kind, id, use });
        t.closes.push({ kind, id, use });
        o.count -= use;
        t.count -= use;
        for (const other of Object.values(stacks)) {
          while (other !== stack && other.length && other[other.length - 1] > at) other.pop();
        }
        if (o.count === 0) stack.pop();
      }
    }
    if (t.canOpen && t.count > 0) stacks[t.char].push(k);
  }
}

/**
 * Draws tokens into `parent`, nesting matched emphasis at most `MAX_INLINE_DEPTH` deep. Text
 * that follows text becomes one text node.
 */
function build(parent, list) {
  const stack = [{ el: parent, id: 0 }];
  const flat = new Set();
  let text = "";
  const top = () => stack[stack.length - 1].el;
  const put = (node) => {
    if (text) top().append(text);
    text = "";
    if (node) top().append(node);
  };
  for (const t of list) {
    if (t.type === "text") text += t.text;
    else if (t.type === "br") put(el("br"));
    else if (t.type === "code") put(el("code", { text: t.text }));
    else if (t.type === "node") put(t.node);
    else {
      for (const c of t.closes) {
        if (flat.has(c.id) || stack[stack.length - 1].id !== c.id) text += t.char.repeat(c.use);
        else {
          put(null);
          stack.pop();
        }
      }
      if (t.count) text += t.char.repeat(t.count);
      for (let k = t.opens.length - 1; k >= 0; k--) {
        const o = t.opens[k];
        if (stack.length > MAX_INLINE_DEPTH) {
          flat.add(o.id);
          text += t.char.repeat(o.use);
        } else {
          const node = el(o.kind);
          put(node);
          stack.push({ el: node, id: o.id });
        }
      }
    }
  }
  put(null);
}
