// The page's only way to the server: JSON requests and Server-Sent Events under /v1, each with
// the session's bearer token in the Authorization header (never in a URL: URLs are logged).

const TOKEN_KEY = "loopwright.token";

/** The token this browser tab signed in with, or null. Kept in sessionStorage: it ends with the tab. */
export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/**
 * An error answer from the server: an RFC 9457 problem document (type, title, status, detail),
 * or what could be made of a response that was not one.
 */
export class ProblemError extends Error {
  constructor({ status, title, detail, type, instance, errors }) {
    super(detail ? `${title}: ${detail}` : title);
    this.name = "ProblemError";
    this.status = status;
    this.title = title;
    this.detail = detail ?? "";
    this.type = type ?? "about:blank";
    this.instance = instance ?? null;
    // Where the request was wrong, as the server says: [{path: "$.name", message}].
    this.errors = Array.isArray(errors)
      ? errors.filter((e) => e && typeof e === "object").map((e) => ({ path: String(e.path ?? "$"), message: String(e.message ?? "") }))
      : [];
  }
}

async function problemFrom(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  const doc = body && typeof body === "object" && !Array.isArray(body) ? body : {};
  return new ProblemError({
    status: response.status,
    title: typeof doc.title === "string" ? doc.title : response.statusText || `HTTP ${response.status}`,
    detail: typeof doc.detail === "string" ? doc.detail : "",
    type: typeof doc.type === "string" ? doc.type : undefined,
    instance: typeof doc.instance === "string" ? doc.instance : undefined,
    errors: doc.errors,
  });
}

function headers(extra = {}) {
  const out = { Accept: "application/json", ...extra };
  const token = getToken();
  if (token) out.Authorization = `Bearer ${token}`;
  return out;
}

/** Build a path (under ../v1, relative to the page, so a proxy may serve both under a prefix) from literal parts and ids, each id percent-encoded as one segment. */
export function path(strings, ...ids) {
  let out = strings[0];
  ids.forEach((id, k) => {
    out += encodeURIComponent(String(id)) + strings[k + 1];
  });
  return out;
}

/** GET (body undefined) or POST a JSON body; resolve to the parsed answer, or throw a ProblemError. */
export async function request(url, body = undefined) {
  return (await exchange(url, body)).body;
}

/** GET a list that says how many matched in X-Total-Count: resolve to {body, total}. */
export async function requestPage(url) {
  const { body, response } = await exchange(url);
  const total = Number(response.headers.get("X-Total-Count"));
  return { body, total: Number.isFinite(total) ? total : (Array.isArray(body) ? body.length : 0) };
}

async function exchange(url, body = undefined) {
  const init = { headers: headers(), cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    throw new ProblemError({ status: 0, title: "The server cannot be reached", detail: String(error.message ?? error) });
  }
  if (!response.ok) throw await problemFrom(response);
  if (response.status === 204) return { body: null, response };
  const text = await response.text();
  return { body: text ? JSON.parse(text) : null, response };
}

/**
 * Follow a Server-Sent Events stream with fetch() (EventSource cannot send an Authorization
 * header). Calls onEvent({id, event, data}) for each event, data parsed as JSON when it is JSON.
 * Resolves when the server ends the stream; rejects with a ProblemError for an error answer.
 * lastEventId, if given, is sent as Last-Event-ID so the server resumes after it.
 */
export async function followEvents(url, { lastEventId = null, signal, onEvent }) {
  const extra = { Accept: "text/event-stream" };
  if (lastEventId) extra["Last-Event-ID"] = lastEventId;
  let response;
  try {
    response = await fetch(url, { headers: headers(extra), cache: "no-store", credentials: "omit", signal });
  } catch (error) {
    if (signal?.aborted) return;
    throw new ProblemError({ status: 0, title: "The event stream broke", detail: String(error.message ?? error) });
  }
  if (!response.ok) throw await problemFrom(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { id: null, event: "message", data: [] };
  // An event with an id but no data still moves the stream's position (onEvent gets data null).
  const dispatch = () => {
    if (!event.data.length && event.id !== null) onEvent({ id: event.id, event: event.event, data: null });
    if (event.data.length) {
      const raw = event.data.join("\n");
      let data = raw;
      try {
        data = JSON.parse(raw);
      } catch {
        data = raw;
      }
      onEvent({ id: event.id, event: event.event, data });
    }
    event = { id: null, event: "message", data: [] };
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      // The SSE grammar: lines end with CRLF, LF or CR; a blank line ends an event. A CR at the
      // end of a chunk waits for the next one, which may begin with the LF of the same CRLF.
      const cut = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length;
      const lines = buffer.slice(0, cut).split(/\r\n|\r|\n/);
      buffer = lines.pop() + buffer.slice(cut);
      for (const line of lines) {
        if (line === "") {
          dispatch();
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "data") event.data.push(val);
        else if (field === "event") event.event = val;
        else if (field === "id" && !val.includes("\0")) event.id = val;
      }
    }
  } catch (error) {
    if (signal?.aborted) return;
    throw new ProblemError({ status: 0, title: "The event stream broke", detail: String(error.message ?? error) });
  } finally {
    reader.releaseLock?.();
  }
}
