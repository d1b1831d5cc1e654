// Showing untrusted text to a person, as loopwright.display does for the terminal.
//
// A model writes tool names, arguments, reasons and answers; a tool writes its results. They can
// hold characters that act on the page instead of showing themselves (a right-to-left override
// that reverses what follows, zero-width characters, line separators). safeText writes each as
// a visible escape (\u202e), safeJson writes them as JSON \uXXXX escapes so the text still parses
// to the exact value. Both return strings: callers put them in the page with textContent only.

const HIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]/u;
const IGNORABLE = [
  [0x034f, 0x034f], [0x115f, 0x1160], [0x17b4, 0x17b5], [0x180b, 0x180f], [0x3164, 0x3164],
  [0xfe00, 0xfe0f], [0xffa0, 0xffa0], [0xe0100, 0xe01ef],
];
const NAMED = { "\t": "\\t", "\n": "\\n", "\r": "\\r" };
const PROSE = new Set(["\n", "\t", "\ufe0e", "\ufe0f"]);
const LAYOUT = new Set(["\n", "\r", "\t"]);

/** Whether one character (one code point) acts on the page or draws nothing. */
export function isHidden(char) {
  const code = char.codePointAt(0);
  if (HIDDEN.test(char)) return true;
  return IGNORABLE.some(([low, high]) => low <= code && code <= high);
}

function hex(code, width) {
  return code.toString(16).padStart(width, "0");
}

function visible(char) {
  if (char in NAMED) return NAMED[char];
  const code = char.codePointAt(0);
  if (code < 0x100) return `\\x${hex(code, 2)}`;
  if (code < 0x10000) return `\\u${hex(code, 4)}`;
  return `\\U${hex(code, 8)}`;
}

function jsonEscape(char) {
  // A code point beyond the BMP is two UTF-16 units: escape each, as JSON does.
  let out = "";
  for (let k = 0; k < char.length; k += 1) out += `\\u${hex(char.charCodeAt(k), 4)}`;
  return out;
}

/**
 * Return value as text to show: every hidden character replaced by a visible escape.
 * With multiline, line breaks, tabs and the presentation selectors stay (prose: an answer).
 */
export function safeText(value, { multiline = false } = {}) {
  let text = typeof value === "string" ? value : String(value);
  if (multiline) text = text.replace(/\r\n/g, "\n");
  let out = "";
  // for...of walks code points; a lone surrogate comes out on its own (category Cs).
  for (const char of text) {
    out += isHidden(char) && !(multiline && PROSE.has(char)) ? visible(char) : char;
  }
  return out;
}

/** Return JSON.stringify(value, null, indent) with every hidden character written as \uXXXX. */
export function safeJson(value, indent = 2) {
  const text = JSON.stringify(value, null, indent) ?? "null";
  let out = "";
  for (const char of text) out += isHidden(char) && !LAYOUT.has(char) ? jsonEscape(char) : char;
  return out;
}
