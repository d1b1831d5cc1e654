// Numbers as the CLI writes them (loopwright.cli._output): costs, token counts, durations.

/** Round value to digits decimals as Python's format does: exact ties go to the even digit. */
function fixed(value, digits) {
  const scale = 10 ** digits;
  const scaled = Math.abs(value) * scale;
  const floor = Math.floor(scaled);
  // A tie that is exact in binary (1.03125 to 4 digits): Python rounds it to even, toFixed up.
  if (scaled - floor === 0.5 && floor % 2 === 0) {
    const text = (floor / scale).toFixed(digits);
    return value < 0 ? `-${text}` : text;
  }
  return value.toFixed(digits);
}

function grouped(text) {
  const negative = text.startsWith("-");
  const [whole, fraction] = (negative ? text.slice(1) : text).split(".");
  const withCommas = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return `${negative ? "-" : ""}${withCommas}${fraction !== undefined ? `.${fraction}` : ""}`;
}

/**
 * `$0.0123`; `unknown` when a price is unknown (never shown as 0), as the CLI's format_cost:
 * four decimals with thousands separators; amounts under 0.0001 keep two significant digits in
 * fixed notation (`$0.000006`), never an exponent.
 */
export function formatCost(amount, currency = "USD") {
  if (amount === null || amount === undefined || Number.isNaN(amount)) return "unknown";
  let text = grouped(fixed(amount, 4));
  if (amount !== 0 && Math.abs(amount) < 0.0001) {
    const digits = 1 - Math.floor(Math.log10(Math.abs(amount)));
    text = fixed(amount, digits).replace(/0+$/, "");
  }
  return currency === "USD" ? `$${text}` : `${text} ${currency}`;
}

/** `1,234 tokens (1,000 in, 234 out)` from a camelCase usage mapping, as the CLI's format_tokens. */
export function formatTokens(usage, unit = " tokens") {
  const u = usage ?? {};
  const given = (key) => Math.trunc(Number(u[key]) || 0);
  const total = given("totalTokens") || given("inputTokens") + given("outputTokens");
  const unreported = given("unreportedRequests");
  const missing = unreported ? `; ${unreported} call${unreported !== 1 ? "s" : ""} not counted` : "";
  return `${grouped(String(total))}${unit} (${grouped(String(given("inputTokens")))} in, ${grouped(String(given("outputTokens")))} out${missing})`;
}

/** A duration in seconds as `850 ms`, `12.3 s`, `4 min 05 s` or `2 h 03 min`. */
export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  const s = Math.max(0, seconds);
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(Math.floor(s % 60)).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

/** Seconds between two ISO 8601 stamps (or from one to now). */
export function secondsBetween(from, to = null) {
  const start = Date.parse(from);
  const end = to ? Date.parse(to) : Date.now();
  return Number.isNaN(start) || Number.isNaN(end) ? null : (end - start) / 1000;
}
