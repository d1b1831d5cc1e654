"""The control plane at ``/ui``, used as a person uses it: in real headless Chromium.

Each test drives Debian's ``chromium`` (``/usr/bin/chromium``) with Playwright, against
``loopwright serve`` started in a subprocess over an assembly written here: scripted models
(one provider per agent, so each instance plays its own script), a tool that needs approval, a
hook whose approval reason quotes the model's arguments, and two tokens (an operator and a
read-only viewer). Agents are started over the API, as another program would; everything after
that is done by clicking and typing in the page, and checked both on the page and through the API.

Screenshots go to ``$LOOPWRIGHT_ARTIFACTS`` (default ``bench/out/screenshots``), which CI keeps.
Without chromium (or the playwright package) the tests skip, unless ``LOOPWRIGHT_REQUIRE_BROWSER``
is set (CI sets it), when they fail. Nothing is downloaded: Playwright runs the installed browser.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[3]
OPERATOR_TOKEN = "op-" + "7" * 40
VIEWER_TOKEN = "view-" + "3" * 40
#: The launch flags: no network of its own (no updates, sync, QUIC), no sandbox (root in CI).
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
#: The runtime's own id of a tool call (``lw-TURN-INDEX-RANDOM``), and an approval digest.
RUNTIME_ID = re.compile(r"lw-\d+-\d+-[0-9a-f]{6}")
DIGEST = re.compile(r"[0-9a-f]{64}")
#: Hang guards only (seconds): a step that works takes a fraction of these.
START_GUARD = 60
STEP_GUARD_MS = 30_000

#: What the attacking model writes into its call's arguments, its text and (through the hook) the reason.
IMG = "<img src=x onerror=\"window.__pwned='img'\">"
SCRIPT_END = "</script><script>window.__pwned='script'</script>"
BIDI = "abc\u202edef"

PLUGIN = '''
"""Tools and a hook for the browser tests."""
import loopwright


@loopwright.tool(requires_approval=True)
def delete(path: str) -> str:
    """Pretend to delete a file.

    Args:
        path: The file.
    """
    return f"deleted {path}"


@loopwright.tool
def publish(title: str, body: str, note: str = "") -> str:
    """Pretend to publish a post.

    Args:
        title: Its title.
        body: Its text.
        note: A note for the editor.
    """
    return f"published {title}"


@loopwright.hookimpl
def loopwright_register_tools(register):
    register(delete, publish)


@loopwright.hookimpl
def loopwright_before_tool_call(call):
    if call.name == "publish":
        return loopwright.RequireApproval(f"publish {call.arguments.get('title', '')!s}")
    return None
'''


def _script(name: str, replies: list[Any]) -> dict[str, Any]:
    return {f"m_{name}": {"kind": "scripted", "replies": replies}}


PROVIDERS: dict[str, Any] = {
    **_script("approve", [
        {"text": "I will delete it", "toolCalls": [{"name": "delete", "arguments": {"path": "old/notes.txt"},
                                                    "id": "call_del"}]},
        "all done: the notes are gone",
    ]),
    **_script("deny", [
        {"text": "I will delete it", "toolCalls": [{"name": "delete", "arguments": {"path": "keep/me.txt"},
                                                    "id": "call_keep"}]},
        "understood, I left it",
    ]),
    **_script("chat", ["hello there", "thanks for your message"]),
    **_script("chat2", ["first answer", "second answer"]),
    **_script("started", ["started from the page"]),
    **_script("slow", [{"text": "thinking very slowly", "delay": 600}]),
    **_script("attack", [
        {"text": f"look: {IMG} {SCRIPT_END}",
         "toolCalls": [{"name": "publish", "id": "call_evil",
                        "arguments": {"title": IMG, "body": SCRIPT_END, "note": BIDI}}]},
        "done",
    ]),
    **_script("raced", [
        {"toolCalls": [{"name": "delete", "arguments": {"path": "y"}, "id": "call_r"}]},
        "ok",
    ]),
    **_script("lead", [
        {"text": "I will ask a helper", "toolCalls": [{"name": "run_agent_async", "id": "call_spawn",
                                                       "arguments": {"agentSwarmUri": "helper",
                                                                     "prompt": "tidy the old notes"}}]},
        "the helper is on it",
    ]),
    **_script("helper", [
        {"text": "tidying", "toolCalls": [{"name": "delete", "arguments": {"path": "old/draft.txt"},
                                           "id": "call_tidy"}]},
        "tidied",
    ]),
    **_script("refused", [
        {"toolCalls": [{"name": "delete", "arguments": {"path": "x"}, "id": "call_x"}]},
        "ok",
    ]),
    # The model names two calls, in two turns, by one id: a harmless one, then (once it is denied) a dangerous one.
    **_script("reused", [
        {"text": "I will clear the cache", "toolCalls": [{"name": "delete", "arguments": {"path": "tmp/cache.txt"},
                                                          "id": "call_same"}]},
        {"text": "then I will delete everything", "toolCalls": [{"name": "delete", "arguments": {"path": "/"},
                                                                 "id": "call_same"}]},
        "all right, nothing deleted",
    ]),
    # Issue 27's control plane.
    **_script("narrow", [
        {"text": "I will delete it", "toolCalls": [{"name": "delete", "arguments": {"path": "narrow.txt"},
                                                    "id": "call_n"}]},
        "done",
    ]),
    **_script("brief", ["briefed"]),
    # Three model calls a second apart, each with its usage: the numbers move while it runs.
    **_script("count", [
        {"text": "step one", "delay": 1.5, "usage": {"inputTokens": 100, "outputTokens": 10},
         "toolCalls": [{"name": "todowrite", "arguments": {"todos": []}}]},
        {"text": "step two", "delay": 1.5, "usage": {"inputTokens": 200, "outputTokens": 20},
         "toolCalls": [{"name": "todowrite", "arguments": {"todos": []}}]},
        {"text": "counted to three", "delay": 1.5, "usage": {"inputTokens": 300, "outputTokens": 30}},
    ]),
    **_script("fork", ["the first answer", "the second answer"]),
    **_script("ask", [
        {"text": "one question first", "toolCalls": [{"name": "ask_user", "id": "call_ask",
                                                      "arguments": {"question": "Which colour should it be?"}}]},
        "blue it is",
    ]),
    **_script("boss", [
        {"text": "I will ask an aide", "toolCalls": [{"name": "run_agent_async", "id": "call_aide",
                                                      "arguments": {"definition": "aide",
                                                                    "prompt": "sweep the old logs"}}]},
        "the aide is on it",
    ]),
    **_script("aide", [
        {"text": "sweeping", "toolCalls": [{"name": "delete", "arguments": {"path": "logs/old.log"},
                                            "id": "call_sweep"}]},
        "swept",
    ]),
    **_script("many", [f"answer {k}" for k in range(30)]),
    **_script("viewed", ["seen, not forked"]),
    **_script("hold", [
        {"text": "I will delete it", "toolCalls": [{"name": "delete", "arguments": {"path": "held.txt"},
                                                    "id": "call_h"}]},
        "held and done",
    ]),
}
AGENTS = {
    "approver": ("m_approve", ["delete"]),
    "denier": ("m_deny", ["delete"]),
    "chatter": ("m_chat", []),
    "chatter2": ("m_chat2", []),
    "starter": ("m_started", []),
    "sleeper": ("m_slow", []),
    "attacker": ("m_attack", ["publish"]),
    "refused": ("m_refused", ["delete"]),
    "reuser": ("m_reused", ["delete"]),
    "raced": ("m_raced", ["delete"]),
    "lead": ("m_lead", ["run_agent_async"]),
    "helper": ("m_helper", ["delete"]),
    "narrow": ("m_narrow", ["delete"]),
    "counter": ("m_count", ["todowrite"]),
    "forker": ("m_fork", []),
    "asker": ("m_ask", ["ask_user"]),
    "boss": ("m_boss", ["run_agent_async"]),
    "aide": ("m_aide", ["delete"]),
    "many": ("m_many", []),
    "holder": ("m_hold", ["delete"]),
    "viewed": ("m_viewed", []),
}
#: A definition with inputs of every kind the start form builds a field for.
BRIEFING = {
    "name": "briefing", "model": "m_brief:any", "description": "Writes a short brief on a topic.",
    "systemPrompt": "Brief on {{ topic }} at depth {{ depth }}; urgent {{ urgent }}; tags {{ tags }}",
    "inputs": {
        "topic": {"type": "string", "description": "What the brief is about."},
        "depth": {"type": "integer", "default": 2},
        "urgent": {"type": "boolean", "default": False},
        "tags": {"type": "array", "default": ["news"]},
    },
}


def _browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401, PLC0415 - only to see whether it is there
    except ImportError:
        return "the playwright package is not installed (it is in the dev dependency group)"
    return None


@pytest.fixture(scope="module")
def artifacts() -> Path:
    folder = Path(os.environ.get("LOOPWRIGHT_ARTIFACTS") or REPO / "bench" / "out" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Server:
    """``loopwright serve`` in a subprocess, and a small client of its API."""

    def __init__(self, folder: Path, port: int = 0) -> None:
        self.folder = folder
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        # This environment without loopwright's own variables (they would change what it loads).
        env = {key: value for key, value in os.environ.items() if not key.startswith("LOOPWRIGHT_")}
        env.update(LW_TEST_OPERATOR=OPERATOR_TOKEN, LW_TEST_VIEWER=VIEWER_TOKEN, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "loopwright.cli", "serve", "-c", str(folder / "loopwright.yaml"),
             "--port", str(port)],
            cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_for_url()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + START_GUARD
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            found = re.search(r"http://127\.0\.0\.1:\d+", line)
            if found:
                return found.group(0)
        self.stop()
        pytest.fail("loopwright serve printed no URL; its output:\n" + "".join(self.output))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def api(self, method: str, path: str, body: Any = None, token: str | None = OPERATOR_TOKEN) -> tuple[int, Any]:
        """Send one request to the API; return the status and the parsed JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310 - our own server
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                text = response.read().decode()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as error:
            text = error.read().decode()
            return error.code, json.loads(text) if text else None

    def start(self, definition: str, prompt: str = "go") -> str:
        """Start a registered definition over the API; return the new instance's id."""
        status, body = self.api("POST", "/v1/instances", {"definition": definition, "prompt": prompt})
        assert status == 201, (status, body)
        return str(body["instanceId"])

    def show(self, instance_id: str) -> dict[str, Any]:
        status, body = self.api("GET", f"/v1/instances/{instance_id}")
        assert status == 200, (status, body)
        return dict(body)

    def wait_for(self, instance_id: str, *states: str) -> dict[str, Any]:
        """Poll the instance until it is in one of ``states`` (a hang guard, not a time limit)."""
        deadline = time.monotonic() + START_GUARD
        summary = self.show(instance_id)
        while summary["state"] not in states:
            if time.monotonic() > deadline:
                pytest.fail(f"{instance_id} stayed {summary['state']}, not {states}; server output:\n"
                            + "".join(self.output[-40:]))
            time.sleep(0.1)
            summary = self.show(instance_id)
        return summary


def _write_assembly(folder: Path, *, tokens: bool = True) -> None:
    (folder / "agents").mkdir()
    (folder / "browser_tools.py").write_text(textwrap.dedent(PLUGIN))
    for name, (model, tools) in AGENTS.items():
        (folder / "agents" / f"{name}.yaml").write_text(
            json.dumps({"name": name, "model": f"{model}:any", "tools": tools}))
    (folder / "agents" / "briefing.yaml").write_text(json.dumps(BRIEFING))
    assembly: dict[str, Any] = {
        "store": {"kind": "file", "path": "./store"},
        "plugins": ["testing", "browser_tools.py"],
        "providers": PROVIDERS,
        "agentDefinitions": {name: f"agents/{name}.yaml" for name in [*AGENTS, "briefing"]},
        "capabilities": {"agents": {"spawn": True, "maxDepth": 2}},
    }
    if tokens:
        assembly["server"] = {"tokens": [
            {"name": "operator", "tokenEnv": "LW_TEST_OPERATOR", "scopes": ["read", "run", "approve"]},
            {"name": "viewer", "tokenEnv": "LW_TEST_VIEWER", "scopes": ["read"]},
        ]}
    (folder / "loopwright.yaml").write_text(json.dumps(assembly, indent=2))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("serve")
    _write_assembly(folder)
    running = Server(folder)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    missing = _browser_missing()
    if missing:
        if os.environ.get("LOOPWRIGHT_REQUIRE_BROWSER"):
            pytest.fail(f"LOOPWRIGHT_REQUIRE_BROWSER is set but {missing}")
        pytest.skip(missing)
    from playwright.sync_api import expect, sync_playwright  # noqa: PLC0415 - only when the browser is there

    expect.set_options(timeout=STEP_GUARD_MS)
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1360, "height": 860})
        context.set_default_timeout(STEP_GUARD_MS)
        try:
            yield context
        finally:
            context.close()


class Page:
    """One browser tab on the control plane, with what it logged and whether any dialog opened."""

    def __init__(self, context: Any, server: Server, artifacts: Path) -> None:
        self.page = context.new_page()
        self.server = server
        self.artifacts = artifacts
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.requests: list[Any] = []
        self.page.on("dialog", self._dialog)
        self.page.on("request", self._request)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("console", self._console)

    def _request(self, request: Any) -> None:
        # A method, not list.append: Playwright marks the handlers it is given.
        self.requests.append(request)

    def _console(self, message: Any) -> None:
        # The page breaking its own policy (an inline style, an HTML sink) is an error too.
        if message.type == "error" and re.search(r"Content Security Policy|Trusted Type", message.text):
            self.errors.append(message.text)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def sign_in(self, token: str = OPERATOR_TOKEN) -> None:
        self.page.goto(self.server.url + "/ui")
        self.page.locator("#token-input").fill(token)
        self.page.locator("#sign-in-form button").click()
        self.page.locator("#app").wait_for(state="visible")

    def card(self, instance_id: str) -> Any:
        return self.page.locator(f'.card[data-instance-id="{instance_id}"]')

    def decisions(self, instance_id: str) -> list[tuple[str, Any]]:
        """The decisions the page sent for ``instance_id``: each one's call id (from its path) and JSON body."""
        marker = f"/v1/instances/{instance_id}/approvals/"
        return [(urllib.parse.unquote(r.url.split(marker, 1)[1]), r.post_data_json)
                for r in self.requests if r.method == "POST" and marker in r.url]

    def select(self, instance_id: str) -> None:
        self.page.locator(f'.node[data-id="{instance_id}"]').click()
        self.expect(self.page.locator("#detail-title")).to_contain_text(instance_id)

    def fact(self, key: str) -> Any:
        return self.page.locator(f'#facts dd[data-fact="{key}"]')

    def transcript(self) -> Any:
        return self.page.locator("#transcript")

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.artifacts / f"{name}.png"))

    @staticmethod
    def expect(locator: Any) -> Any:
        from playwright.sync_api import expect  # noqa: PLC0415 - only when the browser is there

        return expect(locator)

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def page(browser_context: Any, server: Server, artifacts: Path) -> Iterator[Page]:
    tab = Page(browser_context, server, artifacts)
    try:
        yield tab
    finally:
        tab.close()
    assert not tab.errors, f"the page raised: {tab.errors}"


def test_the_page_is_served_with_a_strict_policy(server: Server) -> None:
    request = urllib.request.Request(server.url + "/ui/")  # noqa: S310 - our own server
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        headers = response.headers
        html = response.read().decode()
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "'unsafe-inline'" not in policy
    assert "'unsafe-eval'" not in policy
    assert "frame-ancestors 'none'" in policy
    assert "require-trusted-types-for 'script'" in policy
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "<script>" not in html  # no inline script: only <script type="module" src=...>
    assert not re.search(r"https?://", html), "the page loads nothing from elsewhere"
    # Every file the page names is served, with its type and the same headers.
    named = re.findall(r'(?:src|href)="([^"#:]+)"', html)
    assert {"app.js", "app.css"} <= set(named)
    types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    for name in named:
        with urllib.request.urlopen(server.url + "/ui/" + name, timeout=30) as response:  # noqa: S310
            assert response.headers["Content-Type"].startswith(types[Path(name).suffix]), name
            assert response.headers["Content-Security-Policy"] == policy
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            body = response.read().decode()
        for imported in re.findall(r'from "\./([^"]+)"', body):
            assert urllib.request.urlopen(server.url + "/ui/" + imported, timeout=30).status == 200  # noqa: S310
    # A copy the browser holds is revalidated, not sent again.
    revalidate = urllib.request.Request(server.url + "/ui/", headers={"If-None-Match": headers["ETag"]})  # noqa: S310
    with pytest.raises(urllib.error.HTTPError) as unchanged:
        urllib.request.urlopen(revalidate, timeout=30)  # noqa: S310
    assert unchanged.value.code == 304
    # Only the shipped files, by exact name: no path reaches the file system.
    for tricky in ("_ui.py", "..%2F_ui.py", "%2e%2e/__init__.py", "ui/app.js", "app.js%00.html", "missing.js"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.url + "/ui/" + tricky, timeout=30)  # noqa: S310
        assert refused.value.code == 404, tricky


def test_sign_in_approve_by_clicking_and_watch_the_transcript_finish(page: Page) -> None:
    instance_id = page.server.start("approver")
    (pending,) = page.server.wait_for(instance_id, "waiting_for_approval")["pendingApprovals"]
    assert RUNTIME_ID.fullmatch(pending["toolCallId"]), pending  # the model named it call_del
    assert DIGEST.fullmatch(pending["digest"]), pending
    page.sign_in()
    page.select(instance_id)
    card = page.card(instance_id)
    # The card is the call as the API shows it: its runtime id and its digest.
    page.expect(card).to_have_attribute("data-tool-call-id", pending["toolCallId"])
    page.expect(card).to_have_attribute("data-digest", pending["digest"])
    page.expect(card.locator(".digest")).to_have_text(f"digest {pending['digest'][:16]}")
    page.expect(card.locator(".digest")).to_have_attribute("title", pending["digest"])
    page.expect(card.locator(".where")).to_contain_text(f"call {pending['toolCallId']}")
    page.expect(page.transcript().locator(".item.approval")).to_contain_text(f"digest {pending['digest'][:16]}")
    page.expect(card.locator(".tool")).to_have_text("delete")
    page.expect(card.locator("pre")).to_contain_text('"path": "old/notes.txt"')
    page.expect(card.locator(".reason")).to_have_text("tool 'delete' requires approval")
    page.expect(page.transcript()).to_contain_text("I will delete it")
    page.shot("01-waiting-for-approval")

    card.locator(".approve").click()
    page.expect(card).to_have_count(0)
    # The decision named the call and carried the digest the card showed.
    assert page.decisions(instance_id) == [(pending["toolCallId"], {"decision": "approve",
                                                                    "digest": pending["digest"]})]
    page.expect(page.transcript()).to_contain_text("deleted old/notes.txt")
    page.expect(page.transcript()).to_contain_text("all done: the notes are gone")
    page.expect(page.fact("state")).to_contain_text("waiting")
    page.shot("02-approved-and-finished")

    summary = page.server.show(instance_id)
    assert summary["state"] == "waiting"
    assert summary["pendingApprovals"] == []
    # The token is kept for this tab only, and sent in the Authorization header, never in a URL.
    assert page.page.evaluate("sessionStorage.getItem('loopwright.token')") == OPERATOR_TOKEN
    assert not [r.url for r in page.requests if OPERATOR_TOKEN in r.url]
    streams = [r for r in page.requests if r.url.endswith(f"/v1/instances/{instance_id}/events")]
    assert streams
    assert all(r.headers.get("authorization") == f"Bearer {OPERATOR_TOKEN}" for r in streams)
    other_tab = page.page.context.new_page()
    try:
        other_tab.goto(page.server.url + "/ui/")
        page.expect(other_tab.locator("#sign-in")).to_be_visible()
    finally:
        other_tab.close()


def test_a_tree_and_a_call_held_below_its_root(page: Page) -> None:
    """A lead agent starts a helper; the helper's call waits in the inbox and is approved from there."""
    lead = page.server.start("lead", prompt="tidy up")
    page.server.wait_for(lead, "waiting")
    helper = _child(page.server, lead)
    page.server.wait_for(helper, "waiting_for_approval")
    page.sign_in()
    node = page.page.locator(f'.node[data-id="{lead}"]')
    page.expect(node).to_contain_text("lead")
    child = page.page.locator(f'.node[data-id="{lead}"] + ul .node[data-id="{helper}"]')
    page.expect(child).to_contain_text("helper")
    page.expect(child.locator(".state")).to_have_text("waiting_for_approval")
    page.expect(node.locator(".meta")).to_contain_text("1 waiting below")
    page.select(helper)
    card = page.card(helper)
    page.expect(card.locator("pre")).to_contain_text("old/draft.txt")
    page.expect(card.locator(".where")).to_contain_text("in lead \u203a helper")
    page.expect(page.transcript()).to_contain_text("tidy the old notes")
    page.shot("00-control-plane")
    card.locator(".approve").click()
    page.expect(card).to_have_count(0)
    page.expect(page.transcript()).to_contain_text("tidied")
    page.expect(child.locator(".state")).to_have_text("waiting")
    page.expect(node.locator(".meta")).not_to_contain_text("waiting below")
    assert page.server.wait_for(helper, "waiting")["pendingApprovals"] == []


def _child(server: Server, parent: str) -> str:
    """The id of the one agent ``parent`` started (waiting for it to appear, as a hang guard)."""
    deadline = time.monotonic() + START_GUARD
    while time.monotonic() < deadline:
        children = server.show(parent).get("children") or []
        if children:
            first = children[0]
            return str(first["instanceId"] if isinstance(first, dict) else first)
        time.sleep(0.1)
    pytest.fail(f"{parent} started no agent; server output:\n" + "".join(server.output[-40:]))


def test_deny_with_a_reason(page: Page) -> None:
    instance_id = page.server.start("denier")
    page.server.wait_for(instance_id, "waiting_for_approval")
    page.sign_in()
    page.select(instance_id)
    card = page.card(instance_id)
    card.locator(".deny-reason").fill("keep that file")
    page.shot("03-deny-with-reason")
    card.locator(".deny").click()
    page.expect(card).to_have_count(0)
    page.expect(page.transcript()).to_contain_text("understood, I left it")
    page.expect(page.transcript()).to_contain_text("denied")
    summary = page.server.wait_for(instance_id, "waiting")
    assert summary["pendingApprovals"] == []
    status, records = page.server.api("GET", f"/v1/instances/{instance_id}/records")
    assert status == 200
    text = json.dumps(records)
    assert "keep that file" in text
    assert "operator" in text  # the decision names the token that made it


def test_send_a_message(page: Page) -> None:
    instance_id = page.server.start("chatter", prompt="hi")
    page.server.wait_for(instance_id, "waiting")
    page.sign_in()
    page.select(instance_id)
    page.expect(page.transcript()).to_contain_text("hello there")
    page.page.locator("#message-text").fill("how are you?")
    page.page.locator("#message-form button[type=submit]").click()
    page.expect(page.transcript()).to_contain_text("thanks for your message")
    page.expect(page.transcript().locator(".item.user").last).to_contain_text("how are you?")
    page.expect(page.page.locator("#message-text")).to_have_value("")
    page.shot("04-message-answered")
    assert page.server.wait_for(instance_id, "waiting")["state"] == "waiting"


def test_start_from_the_picker_with_a_form_built_from_the_inputs(page: Page) -> None:
    """The picker lists the registered definitions; the form is the chosen one's inputs; a refusal shows at a field."""
    page.sign_in()
    picker = page.page.locator("#start-definition")
    names = picker.locator("option").evaluate_all("options => options.map(o => o.value)")
    assert names == sorted([*AGENTS, "briefing"])
    picker.select_option("briefing")
    page.expect(page.page.locator("#start-about")).to_contain_text("Writes a short brief on a topic.")
    field = page.page.locator("#start-inputs .field")
    page.expect(field).to_have_count(4)
    topic = page.page.locator("#input-topic")
    page.expect(topic).to_have_attribute("required", "")
    page.expect(page.page.locator('.field[data-input="topic"]')).to_contain_text("What the brief is about.")
    page.expect(page.page.locator("#input-depth")).to_have_attribute("type", "number")
    page.expect(page.page.locator("#input-depth")).to_have_value("2")  # its default
    page.expect(page.page.locator("#input-urgent")).to_have_attribute("type", "checkbox")
    page.expect(page.page.locator("#input-urgent")).not_to_be_checked()
    page.expect(page.page.locator("#input-tags")).to_have_value('["news"]')

    # Without the required topic the server refuses: its reason is shown at the field, and nothing starts.
    before = len(page.server.api("GET", "/v1/instances")[1])
    page.page.locator("#start-form button[type=submit]").click()
    page.expect(page.page.locator("#start-error")).to_contain_text("422")
    page.expect(page.page.locator('.field[data-input="topic"] .field-error')).to_contain_text(
        "missing required input 'topic'")
    assert len(page.server.api("GET", "/v1/instances")[1]) == before
    # JSON that does not parse is caught in the page, at its field.
    page.page.locator("#input-tags").fill("[not json")
    page.page.locator("#start-form button[type=submit]").click()
    page.expect(page.page.locator('.field[data-input="tags"] .field-error')).to_contain_text("must be JSON")
    page.shot("12-start-form-refused")

    topic.fill("owls")
    page.page.locator("#input-depth").fill("3")
    page.page.locator("#input-urgent").check()
    page.page.locator("#input-tags").fill('["birds", "night"]')
    page.page.locator("#start-prompt").fill("keep it short")
    page.page.locator("#start-form button[type=submit]").click()
    page.expect(page.page.locator("#detail-title")).to_contain_text("briefing")
    page.expect(page.page.locator("#start-error")).to_be_hidden()
    page.expect(page.transcript().locator(".item.system")).to_contain_text(
        'Brief on owls at depth 3; urgent true; tags ["birds", "night"]')
    page.expect(page.transcript()).to_contain_text("keep it short")
    page.expect(page.transcript()).to_contain_text("briefed")
    page.shot("13-started-from-the-form")
    started = page.page.locator("#detail-title").text_content().split()[-1]
    assert page.server.wait_for(started, "waiting")["name"] == "briefing"
    # The body the page sent: the typed values, each of its input's type.
    (sent,) = [r.post_data_json for r in page.requests if r.method == "POST" and r.url.endswith("/v1/instances")
               and r.post_data_json.get("inputs", {}).get("topic")]
    assert sent == {"definition": "briefing", "prompt": "keep it short",
                    "inputs": {"topic": "owls", "depth": 3, "urgent": True, "tags": ["birds", "night"]}}


def test_cancel_a_running_instance(page: Page) -> None:
    instance_id = page.server.start("sleeper")
    page.server.wait_for(instance_id, "running")
    page.sign_in()
    page.select(instance_id)
    page.expect(page.fact("state")).to_contain_text("running")
    page.page.locator("#cancel").click()
    page.expect(page.fact("state")).to_contain_text("stopped")
    page.shot("05-cancelled")
    summary = page.server.wait_for(instance_id, "stopped")
    assert summary["cancelled"] is True


def test_the_inbox_shows_what_a_model_wrote_as_text_and_runs_none_of_it(page: Page) -> None:
    """The attack: a model puts HTML and a script end tag in its call, its text and (via the hook) the reason."""
    instance_id = page.server.start("attacker")
    page.server.wait_for(instance_id, "waiting_for_approval")
    page.sign_in()
    page.select(instance_id)
    card = page.card(instance_id)
    page.expect(card.locator(".tool")).to_have_text("publish")
    page.expect(card.locator(".reason")).to_have_text(f"publish {IMG}")
    page.expect(page.transcript()).to_contain_text(f"look: {IMG} {SCRIPT_END}")
    shown = card.locator("pre").text_content()
    # The exact arguments, as JSON: the HTML verbatim, the bidi override as a visible escape.
    assert json.loads(shown) == {"title": IMG, "body": SCRIPT_END, "note": BIDI}
    assert "\u202e" not in shown
    assert "\\u202e" in shown
    page.shot("06-attack-shown-as-text")
    assert page.page.evaluate("window.__pwned") is None
    assert page.page.locator("img").count() == 0
    assert page.page.locator("script").count() == 1  # the page's own module, nothing else
    assert page.dialogs == []


def test_errors_are_shown_to_the_person(page: Page) -> None:
    """401 for a wrong token, 403 for a read-only token that approves; signing out forgets the token."""
    instance_id = page.server.start("refused")
    page.server.wait_for(instance_id, "waiting_for_approval")

    page.page.goto(page.server.url + "/ui")
    page.page.locator("#token-input").fill("not-a-token")
    page.page.locator("#sign-in-form button").click()
    page.expect(page.page.locator("#error")).to_contain_text("401")
    page.expect(page.page.locator("#sign-in")).to_be_visible()
    assert page.page.evaluate("sessionStorage.getItem('loopwright.token')") is None

    page.sign_in(VIEWER_TOKEN)
    card = page.card(instance_id)
    card.locator(".approve").click()
    page.expect(page.page.locator("#error")).to_contain_text("403")
    page.shot("07-forbidden")
    page.expect(card).to_have_count(1)
    assert page.server.show(instance_id)["state"] == "waiting_for_approval"

    page.page.locator("#sign-out").click()
    page.expect(page.page.locator("#sign-in")).to_be_visible()
    assert page.page.evaluate("sessionStorage.getItem('loopwright.token')") is None
    # Nothing seen with that token is left in the page for the next person.
    assert page.page.locator(".node, .card, #transcript .item").count() == 0


def test_deciding_a_call_another_client_decided_shows_the_conflict(page: Page) -> None:
    instance_id = page.server.start("raced")
    page.server.wait_for(instance_id, "waiting_for_approval")
    # The page's timers stand still, so its list is not refreshed between the two decisions.
    page.page.clock.install()
    page.sign_in()
    card = page.card(instance_id)
    page.expect(card).to_have_count(1)
    held = page.server.show(instance_id)["pendingApprovals"][0]  # another client decides it first
    page.expect(card).to_have_attribute("data-digest", held["digest"])
    status, body = page.server.api("POST", f"/v1/instances/{instance_id}/approvals/{held['toolCallId']}",
                                   {"decision": "approve", "digest": held["digest"]})
    assert status in {200, 202}, body
    card.locator(".approve").click()
    page.expect(page.page.locator("#error")).to_contain_text("409")
    # The page sent the very call and digest it showed; the server refused it, as decided already.
    assert page.decisions(instance_id) == [(held["toolCallId"], {"decision": "approve", "digest": held["digest"]})]
    page.shot("08-conflict")
    # The page then reloads the list: the call decided elsewhere leaves the inbox.
    page.expect(card).to_have_count(0)


def _pending_other_than(server: Server, instance_id: str, call_id: str) -> dict[str, Any]:
    """The one call ``instance_id`` holds once it holds one other than ``call_id`` (a hang guard)."""
    deadline = time.monotonic() + START_GUARD
    while time.monotonic() < deadline:
        summary = server.show(instance_id)
        held = [p for p in summary["pendingApprovals"] if p["decision"] is None]
        if summary["state"] == "waiting_for_approval" and held and held[0]["toolCallId"] != call_id:
            (only,) = held
            return dict(only)
        time.sleep(0.1)
    pytest.fail(f"{instance_id} held no call after {call_id}; server output:\n" + "".join(server.output[-40:]))


def _expect_card_of(page: Page, card: Any, pending: dict[str, Any], arguments: str) -> None:
    """``card`` is the one card of its instance, and shows ``pending``: its id, digest and ``arguments``."""
    page.expect(card).to_have_count(1)
    page.expect(card).to_have_attribute("data-tool-call-id", pending["toolCallId"])
    page.expect(card).to_have_attribute("data-digest", pending["digest"])
    page.expect(card.locator("pre")).to_contain_text(arguments)
    page.expect(card.locator(".digest")).to_have_text(f"digest {pending['digest'][:16]}")
    page.expect(card.locator(".where")).to_contain_text(f"call {pending['toolCallId']}")


def test_a_call_id_the_model_reuses_is_a_new_card_and_the_old_digest_decides_nothing(page: Page) -> None:
    """The model names a harmless call and, once it is denied, a dangerous one by the same id.

    The page must show the dangerous call as what it is: a card rebuilt with its arguments, its
    own runtime id and digest; and a decision made on the harmless call's digest runs nothing.
    """
    instance_id = page.server.start("reuser")
    (harmless,) = page.server.wait_for(instance_id, "waiting_for_approval")["pendingApprovals"]
    assert harmless["arguments"] == {"path": "tmp/cache.txt"}
    page.sign_in()
    page.select(instance_id)
    card = page.card(instance_id)
    _expect_card_of(page, card, harmless, '"path": "tmp/cache.txt"')
    card.evaluate("node => { node.dataset.seen = 'harmless'; }")
    card.locator(".deny-reason").fill("not the cache")
    card.locator(".deny").click()

    dangerous = _pending_other_than(page.server, instance_id, harmless["toolCallId"])
    assert dangerous["arguments"] == {"path": "/"}
    # The same model id (call_same) got a new runtime id, and the new call a new digest.
    assert RUNTIME_ID.fullmatch(harmless["toolCallId"]), harmless
    assert RUNTIME_ID.fullmatch(dangerous["toolCallId"]), dangerous
    assert harmless["toolCallId"].startswith("lw-1-0-"), harmless  # turn 1's call
    assert dangerous["toolCallId"].startswith("lw-2-0-"), dangerous  # turn 2's, under the same model id
    assert dangerous["digest"] != harmless["digest"]
    # One card, built anew for the dangerous call: its arguments, id and digest, nothing of the harmless one.
    _expect_card_of(page, card, dangerous, '"path": "/"')
    page.expect(card.locator("pre")).not_to_contain_text("tmp/cache.txt")
    page.expect(card).not_to_have_attribute("data-seen", "harmless")
    # The transcript shows the harmless call denied, and the dangerous one waiting, with its digest.
    page.expect(page.transcript().locator(".item.denied")).to_contain_text(harmless["toolCallId"])
    waiting = page.transcript().locator(".item.approval")
    page.expect(waiting).to_have_count(1)
    page.expect(waiting).to_contain_text(f"(call {dangerous['toolCallId']}) · digest {dangerous['digest'][:16]}")
    page.expect(card.locator(".deny-reason")).to_have_value("")
    page.shot("10-reused-call-id-rebuilt")

    # An approval made on what the person saw before (the harmless call's digest) is refused; nothing runs.
    base = f"/v1/instances/{instance_id}/approvals"
    status, problem = page.server.api("POST", f"{base}/{dangerous['toolCallId']}",
                                      {"decision": "approve", "digest": harmless["digest"]})
    assert status == 409, problem
    assert (problem["toolCallId"], problem["currentDigest"]) == (dangerous["toolCallId"], dangerous["digest"])
    status, problem = page.server.api("POST", f"{base}/{harmless['toolCallId']}",
                                      {"decision": "approve", "digest": harmless["digest"]})
    assert status == 409, problem  # the harmless call itself was decided: nothing waits under its id
    summary = page.server.show(instance_id)
    assert summary["state"] == "waiting_for_approval"
    assert [(p["toolCallId"], p["decision"]) for p in summary["pendingApprovals"]] == [
        (dangerous["toolCallId"], None)]
    page.expect(card).to_have_attribute("data-digest", dangerous["digest"])

    # The person denies the dangerous call too: the page sends the digest of the card it shows now.
    card.locator(".deny").click()
    page.expect(card).to_have_count(0)
    assert page.decisions(instance_id) == [
        (harmless["toolCallId"], {"decision": "deny", "reason": "not the cache", "digest": harmless["digest"]}),
        (dangerous["toolCallId"], {"decision": "deny", "digest": dangerous["digest"]})]
    page.expect(page.transcript()).to_contain_text("all right, nothing deleted")
    assert page.server.wait_for(instance_id, "waiting")["pendingApprovals"] == []
    status, records = page.server.api("GET", f"/v1/instances/{instance_id}/records?kind=tool_call")
    assert status == 200
    assert [r["data"].get("status") for r in records if r["data"].get("status")] == ["denied", "denied"], records


def test_without_tokens_the_page_asks_for_none(tmp_path: Path, browser_context: Any, artifacts: Path) -> None:
    """A server without tokens listens on loopback only, and the page opens without a sign-in."""
    _write_assembly(tmp_path, tokens=False)
    local = Server(tmp_path)
    try:
        instance_id = local.start("chatter", prompt="hi")
        local.wait_for(instance_id, "waiting")
        tab = Page(browser_context, local, artifacts)
        try:
            tab.page.goto(local.url + "/ui")
            tab.expect(tab.page.locator("#app")).to_be_visible()
            tab.expect(tab.page.locator("#sign-in")).to_be_hidden()
            tab.expect(tab.page.locator("#status")).to_contain_text("no token")
            tab.select(instance_id)
            tab.expect(tab.transcript()).to_contain_text("hello there")
            assert not tab.errors
        finally:
            tab.close()
    finally:
        local.stop()


#: Text with every kind of character the page must show as an escape, and some it must keep.
_HIDDEN_SAMPLES = [
    "plain text", "rm -rf ~/x #\r\x1b[2Kls", "abc\u202edef", "zero\u200bwidth", "\ufeffbom", "tag\U000e0041",
    "line\u2028sep", "para\u2029sep", "c1\x85\x9b", "del\x7f", "tab\there\nnewline\r\nCRLF", "emoji\u2764\ufe0f",
    "hangul\u3164filler", "vs\ufe00x", "isolate\u2066x\u2069", "lrm\u200erlm\u200f", "soft\u00adhyphen",
]


def test_the_page_escapes_hidden_characters_as_the_terminal_does(page: Page) -> None:
    """The page's safeText and safeJson (ui/display.js) agree with loopwright.display's, character for character."""
    from loopwright.display import safe_json, safe_text  # noqa: PLC0415 - the reference, only here

    page.page.goto(page.server.url + "/ui/")
    shown = page.page.evaluate(
        """async (samples) => {
            const display = await import("./display.js");
            return samples.map((s) => [display.safeText(s), display.safeText(s, {multiline: true}),
                                       display.safeJson({value: s}, 0)]);
        }""", _HIDDEN_SAMPLES)
    for sample, (one_line, prose, as_json) in zip(_HIDDEN_SAMPLES, shown, strict=True):
        assert one_line == safe_text(sample), sample
        assert prose == safe_text(sample, multiline=True), sample
        assert json.loads(as_json) == {"value": sample}, sample
        assert as_json == safe_json({"value": sample}, separators=(",", ":")), sample


def test_a_broken_event_stream_resumes_where_it_left_off(tmp_path: Path, browser_context: Any,
                                                          artifacts: Path) -> None:
    """The server restarts under the page: it reconnects with Last-Event-ID and shows nothing twice."""
    _write_assembly(tmp_path)
    first = Server(tmp_path)
    instance_id = first.start("chatter2", prompt="hi")
    first.wait_for(instance_id, "waiting")
    tab = Page(browser_context, first, artifacts)
    second = None
    try:
        tab.sign_in()
        tab.select(instance_id)
        tab.expect(tab.transcript()).to_contain_text("first answer")
        port = int(first.url.rsplit(":", 1)[1])
        with tab.page.expect_request(lambda r: r.url.endswith("/events") and r.headers.get("last-event-id"),
                                     timeout=START_GUARD * 1000) as resumed:
            first.stop()
            second = Server(tmp_path, port=port)
        assert second.url == first.url
        assert re.fullmatch(r"\d+-\d+", resumed.value.headers["last-event-id"])
        status, _ = second.api("POST", f"/v1/instances/{instance_id}/messages", {"text": "still there?"})
        assert status == 202
        tab.expect(tab.transcript()).to_contain_text("second answer")
        tab.expect(tab.transcript().locator(".item.assistant")).to_have_count(2)
        tab.expect(tab.transcript().locator(".item.user")).to_have_count(2)
        tab.expect(tab.page.locator("#error")).to_be_hidden()
        tab.shot("09-resumed-after-a-restart")
    finally:
        tab.close()
        first.stop()
        if second is not None:
            second.stop()
    assert not tab.errors


def test_serve_prints_the_ui_and_how_to_sign_in_and_a_browser_finds_it_at_the_root(page: Page) -> None:
    """The lines ``serve`` prints name the page and the tokens' variables (never a token); ``/`` leads there."""
    printed = "".join(page.server.output)
    assert f"the control plane is at {page.server.url}/ui/" in printed
    assert "operator: $LW_TEST_OPERATOR (approve, read, run)" in printed
    assert "viewer: $LW_TEST_VIEWER (read)" in printed
    assert OPERATOR_TOKEN not in printed
    assert VIEWER_TOKEN not in printed
    # An API client asking for JSON at / keeps a JSON answer.
    status, body = page.server.api("GET", "/")
    assert status == 404
    assert "/ui/" in body["detail"]
    # A browser opening the bare address lands on the sign-in of the page.
    page.page.goto(page.server.url + "/")
    assert page.page.url == page.server.url + "/ui/"
    page.expect(page.page.locator("#sign-in")).to_be_visible()


def test_the_page_works_in_a_narrow_window(page: Page) -> None:
    """At 400 px wide nothing is cut off sideways: the panels stack and the controls stay in reach."""
    instance_id = page.server.start("narrow")
    page.server.wait_for(instance_id, "waiting_for_approval")
    page.page.set_viewport_size({"width": 400, "height": 800})
    page.sign_in()
    page.select(instance_id)
    card = page.card(instance_id)
    page.expect(card.locator(".approve")).to_be_visible()
    width = page.page.evaluate("document.documentElement.scrollWidth")
    assert width <= 400, f"the page is {width} px wide in a 400 px window"
    for selector in ("#start-form button[type=submit]", "#sign-out", "#message-form button[type=submit]"):
        box = page.page.locator(selector).bounding_box()
        assert box is not None, selector
        assert box["x"] >= 0, selector
        assert box["x"] + box["width"] <= 400, selector
    page.shot("11-narrow-window")
    card.locator(".approve").click()
    page.expect(card).to_have_count(0)


#: Amounts the page must write as the CLI does (loopwright.cli._output.format_cost), edge cases included.
_COSTS = [None, 0, 0.0, 0.0123, 1234.5678, 0.00005, 0.0000012, 0.000006, 1.03125, 12345678.9, 0.99995,
          0.00009999, 2.5e-9, 0.1, 1e-4, 3]
_USAGES = [None, {}, {"inputTokens": 1000, "outputTokens": 234}, {"totalTokens": 1234567},
           {"inputTokens": 5, "outputTokens": 1, "unreportedRequests": 1},
           {"inputTokens": 5, "outputTokens": 1, "totalTokens": 6, "unreportedRequests": 3}]


def test_costs_and_tokens_are_written_as_the_cli_writes_them(page: Page) -> None:
    """ui/format.js agrees with the CLI's format_cost and format_tokens, character for character."""
    from loopwright.cli._output import format_cost, format_tokens  # noqa: PLC0415 - the reference, only here

    page.page.goto(page.server.url + "/ui/")
    costs, tokens = page.page.evaluate(
        """async ([costs, usages]) => {
            const format = await import("./format.js");
            return [costs.map((c) => format.formatCost(c)), usages.map((u) => format.formatTokens(u))];
        }""", [_COSTS, _USAGES])
    assert costs == [format_cost(c) for c in _COSTS]
    assert tokens == [format_tokens(u) for u in _USAGES]


def _facts(page: Page) -> dict[str, str]:
    return dict(page.page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('#facts dd')].map(
            (dd) => [dd.dataset.fact, dd.textContent]))"""))


def test_live_numbers_move_while_a_slow_model_runs(page: Page) -> None:
    """Turns, tokens and elapsed time change on the page while the instance runs, before it rests."""
    page.sign_in()
    instance_id = page.server.start("counter", prompt="count to three")
    page.select(instance_id)
    running: list[dict[str, str]] = []
    deadline = time.monotonic() + START_GUARD
    while True:
        facts = _facts(page)
        if facts.get("state", "").startswith("running"):
            facts["row"] = page.page.locator(f'.node[data-id="{instance_id}"] .meta').first.text_content() or ""
            running.append(facts)
            if len(running) == 1:
                page.shot("15-live-numbers-while-running")
        elif facts.get("state", "").startswith("waiting"):
            break
        assert time.monotonic() < deadline, f"{instance_id} did not rest: {facts}"
        time.sleep(0.1)
    # While it ran, the page showed the first turn's numbers, then the second's: they moved.
    seen = {(f["turns"], f["tokens"]) for f in running}
    assert ("1", "110 tokens (100 in, 10 out)") in seen, seen
    assert ("2", "330 tokens (300 in, 30 out)") in seen, seen
    elapsed = [f["elapsed"] for f in running if f["elapsed"].endswith("(running)")]
    assert len(set(elapsed)) >= 2, elapsed  # the clock moved too
    assert {f["cost"] for f in running} == {"$0.0000"}  # the scripted model is free: 0, never "unknown"
    # The row in the tree moves too, with the time it has been running.
    assert any(re.search(r"(1 turn|2 turns) · [13]{2}0 tokens · \$0\.0000 · running \d", f["row"]) for f in running), [
        f["row"] for f in running]
    done = _facts(page)
    assert done["turns"] == "3"
    assert done["tokens"] == "660 tokens (600 in, 60 out)"
    assert re.fullmatch(r"\d+(\.\d)? s|\d+ ms", done["elapsed"]), done["elapsed"]
    row = page.page.locator(f'.node[data-id="{instance_id}"] .meta')
    page.expect(row).to_contain_text("3 turns · 660 tokens · $0.0000")


def test_the_timeline_of_a_tree_with_a_child_opened_in_place(page: Page) -> None:
    """Each turn with its model call, its tool calls with status, the agent it started opened in place, and records."""
    boss = page.server.start("boss", prompt="tidy the logs")
    page.server.wait_for(boss, "waiting")
    aide = _child(page.server, boss)
    page.server.wait_for(aide, "waiting_for_approval")
    page.sign_in()
    page.select(boss)
    turn = page.transcript().locator(':scope > .turn[data-turn="1"]')
    page.expect(turn.locator(".turn-facts")).to_contain_text("m_boss:any")
    facts = re.compile(r"\d+ ms · \d+ tokens \(\d+ in, \d+ out\) · \$0\.0000")
    page.expect(turn.locator(".turn-facts")).to_contain_text(facts)
    call = turn.locator(".item.tool_call")
    page.expect(call).to_contain_text('run_agent_async {"definition":"aide","prompt":"sweep the old logs"}')
    page.expect(call.locator(".call-status")).to_contain_text(re.compile(r"success · \d+ ms"))
    page.expect(page.transcript().locator('.turn[data-turn="2"]')).to_contain_text("the aide is on it")
    page.expect(page.fact("subtree")).to_contain_text("2 agents")
    # The agent it started, right after the result that names it, opens in place.
    child = turn.locator(f'.item.child[data-child-id="{aide}"]')
    page.expect(child).to_contain_text("aide")
    page.expect(child.locator(".child-state")).to_have_text("waiting_for_approval")
    child.locator(".child-toggle").click()
    nested = child.locator(f'.timeline-nested[data-instance-id="{aide}"]')
    page.expect(nested).to_contain_text("sweep the old logs")
    page.expect(nested.locator(".item.approval")).to_contain_text("delete (call ")
    page.expect(nested.locator(".turn-actions")).to_have_count(0)  # time travel is for the run shown
    page.expect(page.fact("elapsed")).not_to_have_text("—")
    page.shot("14-timeline-of-a-tree")  # docs/images/control-plane.png, the README's
    # Its records are one click away, per turn.
    turn.locator(":scope > .turn-records > summary").click()
    records = turn.locator(":scope > .turn-records > pre")
    page.expect(records).to_contain_text('"kind": "turn"')
    page.expect(records).to_contain_text('"latency"')
    page.expect(records).to_contain_text('"kind": "tool_call"')
    page.shot("14b-timeline-records")
    # The held call is approved from the inbox: the child's timeline, open in place, shows it go on.
    page.card(aide).locator(".approve").click()
    page.expect(nested).to_contain_text("swept")
    page.expect(nested.locator(".item.approved")).to_contain_text("delete")
    # The whole record log of the run shown.
    page.page.locator("#show-records").click()
    page.expect(page.page.locator("#records-view")).to_contain_text('"kind": "state"')
    child.locator(".child-open").click()
    page.expect(page.page.locator("#detail-title")).to_contain_text(aide)
    assert page.server.wait_for(aide, "waiting")["pendingApprovals"] == []


def test_fork_and_rewind_from_a_turn_with_a_confirmation_and_lineage_both_ways(page: Page) -> None:
    original = page.server.start("forker", prompt="hi")
    page.server.wait_for(original, "waiting")
    status, _ = page.server.api("POST", f"/v1/instances/{original}/messages", {"text": "and again"})
    assert status == 202
    page.server.wait_for(original, "waiting")
    page.sign_in()
    page.select(original)
    first = page.transcript().locator('.turn[data-turn="1"]')
    page.expect(page.transcript().locator('.turn[data-turn="2"]')).to_contain_text("the second answer")
    dialog = page.page.locator("#confirm")

    # The confirmation says what a fork does; keeping things as they are does nothing.
    first.locator(".turn-actions .fork").click()
    page.expect(dialog).to_be_visible()
    page.expect(dialog).to_contain_text("Fork forker at turn 1?")
    page.expect(dialog).to_contain_text("a new instance whose history is this one's up to the end of turn 1")
    page.expect(dialog).to_contain_text("This instance is not changed.")
    page.shot("16-fork-confirmation")
    page.page.locator("#confirm-no").click()
    page.expect(dialog).to_be_hidden()
    assert not [r for r in page.requests if r.method == "POST" and r.url.endswith("/fork")]

    first.locator(".turn-actions .fork").click()
    page.page.locator("#confirm-yes").click()
    page.expect(page.page.locator("#detail-title")).not_to_contain_text(original)
    fork = page.page.locator("#detail-title").text_content().split()[-1]
    assert page.server.show(fork)["state"] == "waiting"
    status, shown = page.server.api("GET", f"/v1/instances/{fork}?live=true")
    assert shown["forkedFrom"] == {"instanceId": original, "turn": 1}
    # Lineage both ways: the fork names its original, the original lists its fork.
    page.expect(page.fact("forked from")).to_contain_text(f"{original} at turn 1")
    page.expect(page.transcript().locator(".item.fork")).to_contain_text("forked from the end of turn 1 of")
    # The history the fork starts from opens in place, from the original's log, up to that turn only.
    page.transcript().locator(".item.fork .history-toggle").click()
    history = page.transcript().locator(f'.timeline-nested.history[data-instance-id="{original}"]')
    page.expect(history).to_contain_text("the first answer")
    page.expect(history.locator(".turn")).to_have_count(2)  # the start, and turn 1
    page.expect(history).not_to_contain_text("the second answer")
    page.fact("forked from").locator("button").click()
    page.expect(page.page.locator("#detail-title")).to_contain_text(original)
    page.expect(page.fact("forks")).to_contain_text(f"{fork} (turn 1)")
    page.expect(page.transcript().locator(".item.fork")).to_contain_text(fork)
    page.shot("17-forked-lineage")

    # Rewind to turn 1: said first, then done; the later turn stays, marked.
    page.transcript().locator('.turn[data-turn="1"] .turn-actions .rewind').click()
    page.expect(dialog).to_contain_text("moves this instance back to the end of turn 1")
    page.page.locator("#confirm-yes").click()
    page.expect(page.transcript().locator(".item.rewind")).to_contain_text("from turn 2 to the end of turn 1")
    page.expect(page.transcript().locator('.turn.rewound[data-turn="2"]')).to_contain_text("the second answer")
    status, marks = page.server.api("GET", f"/v1/instances/{original}/records?kind=rewind")
    assert [m["data"]["to"] for m in marks] == [1]
    assert page.dialogs == []  # the page asked in its own dialog, never window.confirm


def test_the_inbox_holds_every_held_call_and_open_question_answered_in_place(page: Page) -> None:
    asker = page.server.start("asker", prompt="paint it")
    holder = page.server.start("holder", prompt="clean up")
    page.server.wait_for(asker, "waiting")
    (held,) = page.server.wait_for(holder, "waiting_for_approval")["pendingApprovals"]
    page.sign_in()
    question = page.page.locator(f'#inbox .card.question[data-instance-id="{asker}"]')
    page.expect(question.locator(".question-text")).to_have_text("Which colour should it be?")
    page.expect(question.locator(".where")).to_contain_text("asker")
    call = page.page.locator(f'#inbox .card[data-instance-id="{holder}"]:not(.question)')
    page.expect(call).to_have_attribute("data-digest", held["digest"])
    page.expect(page.page.locator("#inbox-count")).not_to_have_text("0")
    # Grouped by tree: each of these two roots' first card names its tree.
    page.expect(question.locator(".tree-label")).to_have_text(f"tree asker …{asker[-8:]}")
    page.expect(call.locator(".tree-label")).to_have_text(f"tree holder …{holder[-8:]}")
    page.shot("18-inbox-question-and-call")
    question.locator(".answer-text").fill("blue, please")
    question.locator(".answer").click()
    page.expect(question).to_have_count(0)
    page.select(asker)
    # The answer is the result of the model's ask_user call; the model goes on from it.
    page.expect(page.transcript().locator(".item.tool_result")).to_contain_text("blue, please")
    page.expect(page.transcript()).to_contain_text("blue it is")
    call.locator(".approve").click()
    page.expect(call).to_have_count(0)
    # The approval sent the digest of the card shown, as every decision from the page does.
    assert page.decisions(holder) == [(held["toolCallId"], {"decision": "approve", "digest": held["digest"]})]
    assert page.server.wait_for(holder, "waiting")["pendingApprovals"] == []


#: The dash of a range of rows on the page (an en dash, as in 1-20 of 22).
DASH = "\u2013"


def test_find_instances_by_text_state_and_agent_in_pages_and_as_a_list(page: Page) -> None:
    ids = [page.server.start("many", prompt=f"needle-{k:02d}") for k in range(22)]
    for instance_id in ids:
        page.server.wait_for(instance_id, "waiting")
    page.sign_in()
    info = page.page.locator("#page-info")
    rows = page.page.locator("#tree .node")
    page.page.locator("#find-text").fill("needle-")
    page.expect(info).to_have_text(f"1{DASH}20 of 22 trees")
    page.expect(rows).to_have_count(20)
    page.expect(rows.first).to_have_attribute("data-id", ids[-1])  # newest first
    page.page.locator("#page-next").click()
    page.expect(info).to_have_text(f"21{DASH}22 of 22 trees")
    assert rows.evaluate_all("rows => rows.map(r => r.dataset.id)") == [ids[1], ids[0]]
    page.page.locator("#page-prev").click()
    page.expect(info).to_have_text(f"1{DASH}20 of 22 trees")
    page.page.locator("#find-text").fill("needle-07")
    page.expect(rows).to_have_count(1)
    page.expect(rows.first).to_have_attribute("data-id", ids[7])
    page.page.locator("#find-state").select_option("error")
    page.expect(rows).to_have_count(0)
    page.expect(page.page.locator("#tree-empty")).to_have_text("Nothing matches.")
    page.page.locator("#find-state").select_option("waiting")
    page.expect(rows).to_have_count(1)
    page.page.locator("#find-text").fill("")
    page.page.locator("#find-definition").select_option("many")
    page.expect(info).to_have_text(f"1{DASH}20 of 22 trees")
    page.page.locator("#find-view").select_option("list")
    page.expect(info).to_have_text(f"1{DASH}20 of 22 instances")
    page.expect(page.page.locator("#tree ul")).to_have_count(0)  # a flat list
    page.shot("19-find-instances")
    # Offline and dependency-light: everything the page loaded came from this server.
    assert page.requests
    assert all(r.url.startswith(page.server.url + "/") for r in page.requests), {
        r.url for r in page.requests if not r.url.startswith(page.server.url)}


def test_an_answer_streams_into_the_timeline_as_the_model_writes_it(tmp_path: Path, browser_context: Any,
                                                                     artifacts: Path) -> None:
    """The page shows each piece of the answer while the model still holds the rest; the whole message replaces them.

    The model is a fake OpenAI server that streams its answer in pieces and stops at gates
    (``_gated_model``): each step is checked while the model waits, by events, never by sleeps.
    """
    from _gated_model import Gate, Streamed, gated_model  # noqa: PLC0415 - only this test streams

    with gated_model() as model:
        (tmp_path / "agents").mkdir()
        (tmp_path / "agents" / "streamer.yaml").write_text("name: streamer\nmodel: live:gpt-test\n")
        (tmp_path / "loopwright.yaml").write_text(json.dumps({
            "store": {"kind": "file", "path": "./store"},
            "providers": {"live": {"kind": "openai", "baseUrl": model.url, "apiKey": "test-key", "stream": True}},
            "agentDefinitions": {"streamer": "agents/streamer.yaml"}}))
        local = Server(tmp_path)
        tab = Page(browser_context, local, artifacts)
        try:
            held, first, second = Gate(), Gate(), Gate()
            model.enqueue(Streamed([held, "Hello", first, " wide", second, " world"]))
            tab.page.goto(local.url + "/ui")
            tab.expect(tab.page.locator("#app")).to_be_visible()
            instance_id = local.start("streamer", prompt="greet the world")
            held.wait_reached()  # the model has the request and holds its answer
            tab.select(instance_id)
            # The task's message came through the page's event stream: the stream follows the instance.
            tab.expect(tab.transcript().locator(".item.user")).to_contain_text("greet the world")
            streaming = tab.transcript().locator(".item.assistant.streaming")
            held.open()
            first.wait_reached()
            tab.expect(streaming).to_contain_text("Hello")
            first.open()
            second.wait_reached()  # two pieces are out; the model holds the last one
            tab.expect(streaming).to_contain_text("Hello wide")
            tab.expect(streaming).not_to_contain_text("world")
            tab.shot("20-answer-streaming-in")
            second.open()
            tab.expect(tab.transcript().locator(".item.assistant:not(.streaming)")).to_contain_text("Hello wide world")
            tab.expect(streaming).to_have_count(0)
            assert local.wait_for(instance_id, "waiting")["state"] == "waiting"
            assert not tab.errors
        finally:
            tab.close()
            local.stop()


def test_a_read_only_token_cannot_fork_rewind_or_start_and_the_page_says_so(page: Page) -> None:
    """The attack: a ``read`` token presses Fork and Rewind, and starts; each is a 403, and nothing changes."""
    instance_id = page.server.start("viewed", prompt="look")
    page.server.wait_for(instance_id, "waiting")
    before = {s["instanceId"] for s in page.server.api("GET", "/v1/instances")[1]}
    page.sign_in(VIEWER_TOKEN)
    page.select(instance_id)
    turn = page.transcript().locator(':scope > .turn[data-turn="1"]')
    turn.locator(".turn-actions .fork").click()
    page.page.locator("#confirm-yes").click()
    page.expect(page.page.locator("#error")).to_contain_text("403")
    turn.locator(".turn-actions .rewind").click()
    page.page.locator("#confirm-yes").click()
    page.expect(page.page.locator("#error")).to_contain_text("403")
    page.page.locator("#start-definition").select_option("viewed")
    page.page.locator("#start-form button[type=submit]").click()
    page.expect(page.page.locator("#start-error")).to_contain_text("403")
    # Straight at the API, with no token and with the read-only one: refused, and nothing is written.
    for token, status in ((None, 401), (VIEWER_TOKEN, 403)):
        for action, body in (("fork", {"turn": 1}), ("rewind", {"turn": 0})):
            answer = page.server.api("POST", f"/v1/instances/{instance_id}/{action}", body, token=token)
            assert answer[0] == status, (action, token, answer)
    assert {s["instanceId"] for s in page.server.api("GET", "/v1/instances")[1]} == before
    status, records = page.server.api("GET", f"/v1/instances/{instance_id}/records")
    assert status == 200
    assert not [r for r in records if r["kind"] in {"fork", "rewind"}]
    # The definitions are readable with it: the picker is there, only starting is refused.
    assert page.server.api("GET", "/v1/definitions", token=VIEWER_TOKEN)[0] == 200


def test_the_readme_picture(tmp_path: Path, browser_context: Any, artifacts: Path) -> None:
    """On a fresh store: a lead agent's timeline with its aide opened in place, the tree, and the aide's call held.

    Saved as ``control-plane.png`` among the screenshots: ``docs/images/control-plane.png`` is a copy.
    """
    _write_assembly(tmp_path)
    local = Server(tmp_path)
    tab = Page(browser_context, local, artifacts)
    try:
        boss = local.start("boss", prompt="tidy the logs")
        local.wait_for(boss, "waiting")
        aide = _child(local, boss)
        local.wait_for(aide, "waiting_for_approval")
        tab.page.set_viewport_size({"width": 1280, "height": 760})
        tab.sign_in()
        tab.page.locator("#start-definition").select_option("briefing")
        tab.select(boss)
        child = tab.transcript().locator(f'.item.child[data-child-id="{aide}"]')
        child.locator(".child-toggle").click()
        tab.expect(child.locator(".timeline-nested .item.approval")).to_contain_text("delete")
        tab.expect(tab.card(aide).locator(".tree-label")).to_contain_text("tree boss")
        tab.expect(tab.fact("elapsed")).not_to_have_text("—")
        tab.page.evaluate("""() => {
            const box = document.getElementById("transcript");
            const call = box.querySelector(':scope > .turn[data-turn="1"] .item.tool_call');
            box.scrollTop = call.getBoundingClientRect().top - box.getBoundingClientRect().top + box.scrollTop - 8;
            window.scrollTo(0, 0);
        }""")
        tab.shot("control-plane")
        assert not tab.errors
    finally:
        tab.close()
        local.stop()
