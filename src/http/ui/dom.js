// Building the page's elements. Everything that came from the server (model output, tool
// input and output, titles) is put into the page as text nodes or `textContent`, never parsed
// as markup: `h()` has no way to insert HTML.

/** `h("div", {class: "x", onclick: f}, "text", child)`: an element with properties and children. */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  if (props) {
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") el.className = value;
      else if (key === "text") el.textContent = value;
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else if (key === "dataset") Object.assign(el.dataset, value);
      else if (key in el && typeof value !== "string") el[key] = value;
      else el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

/** Appends children: nodes as they are, anything else as text. */
export function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Removes every child. */
export function clear(el) {
  el.replaceChildren();
  return el;
}

/** Shows or hides an element (the `hidden` attribute). */
export function show(el, visible) {
  el.hidden = !visible;
}

/** JSON as readable text. */
export function pretty(value) {
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value;
    }
  }
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** A one-line summary of a value, at most `max` characters. */
export function brief(value, max = 120) {
  const text = typeof value === "string" ? value : JSON.stringify(value) ?? "";
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

const relative = new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });

/** "3 min ago", "yesterday". */
export function ago(iso) {
  const then = Date.parse(iso);
  if (Number.isNaN(then)) return "";
  const seconds = Math.round((then - Date.now()) / 1000);
  const steps = [
    [60, "second"],
    [3600, "minute", 60],
    [86400, "hour", 3600],
    [604800, "day", 86400],
    [Infinity, "week", 604800],
  ];
  for (const [limit, unit, size = 1] of steps) {
    if (Math.abs(seconds) < limit) return relative.format(Math.round(seconds / size), unit);
  }
  return "";
}

/** "14:03:07". */
export function clock(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? "" : date.toLocaleTimeString();
}

/** "1,234". */
export function count(n) {
  return Number(n ?? 0).toLocaleString();
}

/** "$0.0000525", "$1.5", "$12.35": US dollars with three significant digits at least. */
export function usd(n) {
  const x = Number(n ?? 0);
  if (!x) return "$0";
  const digits = Math.min(9, Math.max(2, 2 - Math.floor(Math.log10(Math.abs(x)))));
  return `$${x.toFixed(digits).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "")}`;
}

/** "12.3 KB". */
export function bytes(n) {
  const units = ["B", "KB", "MB", "GB"];
  let value = Number(n ?? 0);
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

/** "1.2 s", "340 ms". */
export function duration(ms) {
  if (!Number.isFinite(ms) || ms < 0) return "";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** True for a UUID (what ids in links must be). */
export function isId(value) {
  return typeof value === "string" && UUID.test(value);
}

/**
 * Puts `text` on the clipboard; resolves to whether it did. The clipboard API needs a secure
 * context (https, or localhost): elsewhere a selected, hidden text area is copied instead.
 */
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      // Refused (no permission, or the page is not focused): try the other way.
    }
  }
  const area = h("textarea", { class: "visually-hidden", readonly: true, "aria-hidden": "true", tabindex: "-1" });
  area.value = text;
  document.body.append(area);
  area.select();
  let copied = false;
  try {
    copied = document.execCommand("copy");
  } catch {
    copied = false;
  }
  area.remove();
  return copied;
}

/** A small button that copies what `text()` returns, and says for a moment that it did. */
export function copyButton(text, label) {
  const button = h("button", { class: "copy-button", type: "button", text: "Copy", title: label, "aria-label": label });
  let timer = null;
  button.addEventListener("click", async () => {
    const copied = await copyText(text());
    button.textContent = copied ? "Copied" : "Copy failed";
    clearTimeout(timer);
    timer = setTimeout(() => {
      button.textContent = "Copy";
    }, 1500);
  });
  return button;
}
