// Small helpers for building the page: every module makes its elements the same way.

/** Make an element with a class and text (text always through textContent, never as HTML). */
export function el(tag, className = "", text = undefined) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** The value if it is an array, else an empty one (for fields a summary may lack). */
export function list(value) {
  return Array.isArray(value) ? value : [];
}

/** An instance id short enough for a label: its last 8 characters after an ellipsis. */
export function shortId(id) {
  return id.length > 12 ? `…${id.slice(-8)}` : id;
}
