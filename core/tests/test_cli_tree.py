"""Steering a whole agent tree from its root, through the CLI as subprocesses (issue 11).

The project's provider ``tree`` is stateless: each reply is worked out from the request's
transcript, so a new process (after a crash or a decision) goes on where the last one stopped.
Its models are roles:

* ``root`` starts ``holder`` and ``middle``, awaits both, then answers ``root done``;
* ``holder`` calls ``touch(A)`` (held: the definition requires approval), then answers;
* ``middle`` starts ``grand``, awaits it, then answers;
* ``grand`` calls ``touch(G)`` (held), then answers.

``touch`` appends a line to ``touched-NAME`` beside the assembly, so a test counts how many
times each call ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import in_terminal, runtime_id

import loopwright

#: Generous hang guards only; no test asserts how fast anything is.
TIMEOUT = 120

PLUGIN = textwrap.dedent('''
    import json
    import pathlib

    import loopwright
    from loopwright import Message, ModelResponse, ToolCall, Usage
    from loopwright.abc import Provider

    HERE = pathlib.Path(__file__).parent

    @loopwright.tool(parallel_safe=False)
    def touch(name: str) -> str:
        """Add a line to the marker touched-NAME.

        Args:
            name: The marker.
        """
        with open(HERE / f"touched-{name}", "a") as f:
            f.write("x\\n")
        return f"touched {name}"

    def _results(messages):
        return [m for m in messages if m.role == "tool"]

    def _started(messages):
        ids = []
        for m in _results(messages):
            if m.name == "run_agent_async":
                ids.append(json.loads(m.content)["instanceId"])
        return ids

    def _calls(role, turn, *calls):
        tool_calls = tuple(ToolCall(id=f"{role}-{turn}-{k}", name=n, arguments=a) for k, (n, a) in enumerate(calls))
        return Message(role="assistant", content=None, tool_calls=tool_calls)

    def _plan(role, messages):
        done = {m.name for m in _results(messages)}
        turn = sum(1 for m in messages if m.role == "assistant")
        if role == "root":
            if "run_agent_async" not in done:
                return _calls(role, turn, ("run_agent_async", {"agentSwarmUri": "holder", "prompt": "hold"}),
                              ("run_agent_async", {"agentSwarmUri": "middle", "prompt": "delegate"}))
            if "await_agent" not in done:
                return _calls(role, turn, ("await_agent", {"ids": _started(messages), "all": True}))
            return Message(role="assistant", content="root done")
        if role == "middle":
            if "run_agent_async" not in done:
                return _calls(role, turn, ("run_agent_async", {"agentSwarmUri": "grand", "prompt": "hold"}))
            if "await_agent" not in done:
                return _calls(role, turn, ("await_agent", {"ids": _started(messages)}))
            return Message(role="assistant", content="middle done")
        if role in {"chat", "quiet"}:
            said = [m.content for m in messages if m.role == "user" and m.source != "runtime"]
            return Message(role="assistant", content="seen: " + "|".join(said))
        if role == "spawnchat":
            last = messages[-1]
            if last.role == "user" and last.content == "spawn":
                return _calls(role, turn, ("run_agent_async", {"agentSwarmUri": "quiet", "prompt": "x"}))
            return Message(role="assistant", content="spawned" if last.role == "tool" else "hello")
        if role == "pair" and "touch" not in done:
            return _calls(role, turn, ("touch", {"name": "P1"}), ("touch", {"name": "P2"}))
        name = {"holder": "A", "grand": "G", "solo": "S", "pair": "P"}[role]
        if "touch" not in done:
            return _calls(role, turn, ("touch", {"name": name}))
        return Message(role="assistant", content=f"{role} done")

    class TreeProvider(Provider):
        free = True

        def __init__(self, settings):
            self.settings = settings

        async def complete(self, request):
            message = _plan(request.model, request.messages)
            return ModelResponse(message=message, usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2,
                                 requests=1), finish_reason="tool_calls" if message.tool_calls else "stop")

    @loopwright.hookimpl
    def loopwright_register_tools(register):
        register(touch)

    @loopwright.hookimpl
    def loopwright_register_providers(register):
        register("tree", TreeProvider)
''')

AGENT_TOOLS = ["run_agent_async", "await_agent"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.pop("PYTHONPATH", None)
    return env


class Project:
    """An assembly folder with the ``tree`` provider and the definitions of the four roles."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True)
        (root / "tree_plugin.py").write_text(PLUGIN)
        agents = {
            "root": {"tools": AGENT_TOOLS},
            "middle": {"tools": AGENT_TOOLS},
            "holder": {"tools": ["touch"], "requiresApproval": ["touch"]},
            "grand": {"tools": ["touch"], "requiresApproval": ["touch"]},
            "solo": {"tools": ["touch"], "requiresApproval": ["touch"]},
            "pair": {"tools": ["touch"], "requiresApproval": ["touch"]},
            "chat": {"tools": []},
            "quiet": {"tools": []},
            "spawnchat": {"tools": ["run_agent_async"]},
        }
        (root / "agents").mkdir()
        for name, keys in agents.items():
            (root / "agents" / f"{name}.yaml").write_text(json.dumps({"name": name, "model": f"tree:{name}", **keys}))
        data = {
            "store": {"kind": "file", "path": str(root / "store")},
            "plugins": ["tree_plugin.py"],
            "capabilities": {"shell": "none", "agents": {"spawn": True, "maxDepth": 4}},
            "agentDefinitions": {name: f"agents/{name}.yaml" for name in agents},
        }
        (root / "loopwright.yaml").write_text(json.dumps(data, indent=1))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=self.root,
                                  capture_output=True, text=True, env=_env(), timeout=TIMEOUT, check=False)
        except subprocess.TimeoutExpired as exc:  # a hang guard: show where it stopped
            raise AssertionError(f"loopwright {' '.join(args)} hung; stderr: {exc.stderr!r}") from None

    def cli_json(self, *args: str, code: int = 0) -> Any:
        done = self.cli(*args, "--json")
        assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
        return json.loads(done.stdout)

    def headers(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.root / "store").glob("*/instance.json"))]

    def header(self, name: str) -> dict[str, Any]:
        found = [h for h in self.headers() if h["name"] == name]
        assert len(found) == 1, [h["name"] for h in self.headers()]
        return found[0]

    def call_id(self, name: str, model_id: str) -> str:
        """Return the runtime's id of the call the model named ``model_id`` in instance ``name``'s transcript."""
        folder = self.root / "store" / self.header(name)["instanceId"]
        calls = [loopwright.ToolCall(id=c["id"], name=c["name"], arguments=c.get("arguments", {}),
                                     wire_id=c.get("wireId"))
                 for line in (folder / "entries.jsonl").read_text().splitlines()
                 if (entry := json.loads(line)).get("t") == "msg"
                 for c in entry["m"].get("toolCalls", [])]
        return runtime_id(calls, model_id)

    def digest(self, name: str) -> str:
        """Return the digest of the one call instance ``name`` holds (computed from its saved entry)."""
        (pending,) = self.header(name)["pendingApprovals"]
        return loopwright.approval_digest(pending)

    def touched(self, name: str) -> int:
        path = self.root / f"touched-{name}"
        return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path / "project")


def _held(project: Project) -> tuple[str, dict[str, str]]:
    """Run the root until its tree waits; return the root's id and the held call ids by holder name."""
    done = project.cli("run", "root", "-p", "go")
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)
    root = project.header("root")["instanceId"]
    calls = {name: project.header(name)["pendingApprovals"][0]["toolCallId"] for name in ("holder", "grand")}
    return root, calls


# ------------------------------------------------------------------------------------------
# 1. Approvals anywhere in the tree, decided from the root
# ------------------------------------------------------------------------------------------


def test_run_stops_when_the_tree_waits_and_lists_every_held_call_with_its_path(project: Project) -> None:
    """``run`` exits 3 once only approvals are left in the tree, naming each call, its holder and path."""
    done = project.cli("run", "root", "-p", "go")
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)
    root, holder, middle, grand = (project.header(n) for n in ("root", "holder", "middle", "grand"))
    assert root["state"] == "running"
    assert (holder["state"], grand["state"]) == ("waiting_for_approval", "waiting_for_approval")
    assert f"instance {root['instanceId']} is running, waiting on 2 approvals in its tree" in done.stdout
    assert f"middle {middle['instanceId']} > grand {grand['instanceId']}" in done.stdout
    assert f"loopwright approve {root['instanceId']} --call CALL_ID" in done.stdout
    assert project.touched("A") == project.touched("G") == 0
    shown = project.cli("show", root["instanceId"])
    assert shown.returncode == 0, shown.stderr
    assert "running, waiting on 2 approvals in its tree" in shown.stdout
    data = project.cli_json("show", root["instanceId"])
    entries = {p["toolCallId"]: p for p in data["treePendingApprovals"]}
    grand_call = grand["pendingApprovals"][0]["toolCallId"]
    assert entries[grand_call]["instanceId"] == grand["instanceId"]
    assert entries[grand_call]["tool"] == "touch"
    assert entries[grand_call]["arguments"] == {"name": "G"}
    assert entries[grand_call]["reason"]
    assert [step["instanceId"] for step in entries[grand_call]["path"]] == [
        root["instanceId"], middle["instanceId"], grand["instanceId"]]
    assert [step["name"] for step in entries[grand_call]["path"]] == ["root", "middle", "grand"]
    assert data["tree"]["waitingOn"] == 2


def test_approve_by_the_roots_id_from_new_processes_finishes_the_tree(project: Project) -> None:
    """``approve ROOT --call`` decides a grandchild's call, then a child's; each runs once, the root finishes."""
    root, calls = _held(project)
    first = project.cli("approve", root, "--call", calls["grand"])
    assert first.returncode == 3, (first.returncode, first.stdout, first.stderr)  # the holder's call still waits
    assert project.touched("G") == 1
    assert project.header("grand")["state"] == "waiting"  # answered; rests ready for a message
    assert project.header("middle")["text"] == "middle done"
    assert project.touched("A") == 0
    second = project.cli_json("approve", root, "--call", calls["holder"])
    assert second["state"] == "waiting", second
    assert second["text"] == "root done"
    assert (project.touched("A"), project.touched("G")) == (1, 1)


def test_deciding_a_call_that_no_longer_waits_is_an_error(project: Project) -> None:
    """A second approve of the same call, and an unknown call, exit 2 with a clear message; nothing runs again."""
    root, calls = _held(project)
    assert project.cli("approve", root, "--call", calls["grand"]).returncode == 3
    again = project.cli("approve", root, "--call", calls["grand"])
    assert again.returncode == 2, (again.returncode, again.stdout, again.stderr)
    assert f"no call {calls['grand']!r} is waiting for approval in the tree of instance {root}" in again.stderr
    unknown = project.cli("deny", root, "--call", "made-up", "--reason", "no")
    assert unknown.returncode == 2, unknown.stderr
    assert project.touched("G") == 1


def test_approve_subtree_decides_every_call_and_prints_them(project: Project) -> None:
    """``approve ROOT --subtree`` decides both held calls (printing each with its holder) and the root finishes."""
    root, calls = _held(project)
    ids = {name: project.header(name)["instanceId"] for name in ("middle", "grand", "holder")}
    digests = {name: project.digest(name) for name in ("grand", "holder")}
    done = project.cli("approve", root, "--subtree")
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert (f'approved: {calls["grand"]} touch {{"name": "G"}} (in root {root} > middle {ids["middle"]} > '
            f'grand {ids["grand"]}; digest {digests["grand"]})') in done.stderr
    assert (f'approved: {calls["holder"]} touch {{"name": "A"}} (in root {root} > holder {ids["holder"]}; '
            f'digest {digests["holder"]})') in done.stderr
    assert (project.touched("A"), project.touched("G")) == (1, 1)
    assert project.header("root")["text"] == "root done"


def test_deny_from_the_root_reaches_the_holder(project: Project) -> None:
    """``deny ROOT --call`` denies a grandchild's call: it never runs, and the reason reaches its model."""
    root, calls = _held(project)
    done = project.cli("deny", root, "--call", calls["grand"], "--reason", "not today")
    assert done.returncode == 3, done.stderr
    assert project.touched("G") == 0
    records = project.cli("records", project.header("grand")["instanceId"], "--kind", "tool_call")
    assert "denied: not today" in records.stdout


def test_deny_subtree_denies_every_call_and_the_root_finishes(project: Project) -> None:
    """``deny ROOT --subtree --reason``: both held calls are denied (each printed with its holder), neither runs,
    each holder's model reads the reason, and the root finishes. ``--call`` with ``--subtree`` is a usage error."""
    root, calls = _held(project)
    both = project.cli("deny", root, "--subtree", "--call", calls["grand"])
    assert both.returncode == 2, both.stderr
    assert "give --call or --subtree, not both" in both.stderr
    ids = {name: project.header(name)["instanceId"] for name in ("middle", "grand", "holder")}
    digests = {name: project.digest(name) for name in ("grand", "holder")}
    done = project.cli("deny", root, "--subtree", "--reason", "not today")
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert (f'denied: {calls["grand"]} touch {{"name": "G"}} (in root {root} > middle {ids["middle"]} > '
            f'grand {ids["grand"]}; digest {digests["grand"]})') in done.stderr
    assert (f'denied: {calls["holder"]} touch {{"name": "A"}} (in root {root} > holder {ids["holder"]}; '
            f'digest {digests["holder"]})') in done.stderr
    assert project.touched("A") == project.touched("G") == 0
    for holder in ("holder", "grand"):
        records = project.cli("records", project.header(holder)["instanceId"], "--kind", "tool_call")
        assert "denied: not today" in records.stdout, records.stdout
    assert project.header("root")["text"] == "root done"


def test_approve_without_call_on_a_root_that_holds_nothing_points_at_the_tree(project: Project) -> None:
    """``approve ROOT`` alone decides only ROOT's own calls; with none, it says how to reach the tree (exit 2)."""
    root, _calls = _held(project)
    done = project.cli("approve", root)
    assert done.returncode == 2, done.stderr
    assert "2 calls wait in its tree" in done.stderr
    assert "--subtree" in done.stderr
    assert project.touched("A") == project.touched("G") == 0


# ------------------------------------------------------------------------------------------
# 2. Decisions bound to the exact call
# ------------------------------------------------------------------------------------------


def _digest(name: str, arguments: dict[str, Any]) -> str:
    text = json.dumps({"arguments": arguments, "name": name}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_call_shown_otherwise_than_it_would_run_is_refused_and_stays_held(project: Project) -> None:
    """The header shows harmless arguments but the log holds another call: approving is refused, nothing runs."""
    done = project.cli("run", "solo", "-p", "go")
    assert done.returncode == 3, done.stderr
    header = project.header("solo")
    path = project.root / "store" / header["instanceId"] / "instance.json"
    header["pendingApprovals"][0]["arguments"] = {"name": "harmless"}
    path.write_text(json.dumps(header))
    refused = project.cli("approve", header["instanceId"])
    assert refused.returncode == 2, (refused.returncode, refused.stdout, refused.stderr)
    assert "is not the call shown for approval" in refused.stderr
    assert project.touched("S") == project.touched("harmless") == 0
    assert project.header("solo")["pendingApprovals"][0].get("decision") is None


def test_a_call_changed_after_its_decision_is_held_again(project: Project) -> None:
    """A decision recorded for one call (its digest saved) does not run the call the log holds after it changed."""
    done = project.cli("run", "solo", "-p", "go")
    assert done.returncode == 3, done.stderr
    header = project.header("solo")
    iid = header["instanceId"]
    folder = project.root / "store" / iid
    # A decision another process recorded (then it stopped before going on), bound to touch(S).
    header["pendingApprovals"][0].update(decision="approved", decisionDigest=_digest("touch", {"name": "S"}))
    (folder / "instance.json").write_text(json.dumps(header))
    # The held call in the log changes afterwards.
    log = (folder / "entries.jsonl").read_text().replace('"name":"S"', '"name":"X"')
    (folder / "entries.jsonl").write_text(log)
    picked = project.cli("worker", "--once")
    assert picked.returncode == 0, picked.stderr
    assert project.touched("X") == project.touched("S") == 0
    after = project.header("solo")
    assert after["state"] == "waiting_for_approval"
    (pending,) = after["pendingApprovals"]
    assert pending.get("decision") is None
    assert pending["arguments"] == {"name": "X"}


REWRITE_PLUGIN = textwrap.dedent("""
    import loopwright

    @loopwright.hookimpl
    def loopwright_before_tool_call(call):
        if call.name == "touch" and call.arguments.get("name") == "S":
            return loopwright.ModifyInputs({"name": "R"})
        return None
""")


def test_approving_a_call_a_hook_changed_before_it_was_held_runs_it_as_shown(project: Project) -> None:
    """A hook rewrites touch(S) to touch(R) before the call is held: ``approve ID --call`` in a new process
    binds to touch(R), runs it once, and touch(S) never runs."""
    (project.root / "rewrite_plugin.py").write_text(REWRITE_PLUGIN)
    config = json.loads((project.root / "loopwright.yaml").read_text())
    config["plugins"].append("rewrite_plugin.py")
    (project.root / "loopwright.yaml").write_text(json.dumps(config))
    done = project.cli("run", "solo", "-p", "go")
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)
    header = project.header("solo")
    iid = header["instanceId"]
    (pending,) = header["pendingApprovals"]
    assert pending["arguments"] == {"name": "R"}
    assert pending["originalDigest"] == _digest("touch", {"name": "S"})
    valid = project.cli("validate", str(project.root / "store" / iid / "instance.json"))
    assert valid.returncode == 0, valid.stdout
    approved = project.cli("approve", iid, "--call", pending["toolCallId"])
    assert approved.returncode == 0, (approved.returncode, approved.stdout, approved.stderr)
    assert (project.touched("R"), project.touched("S")) == (1, 0)
    after = project.header("solo")
    assert (after["state"], after["pendingApprovals"], after.get("text")) == ("waiting", [], "solo done")
    again = project.cli("approve", iid, "--call", pending["toolCallId"])
    assert again.returncode == 2, (again.returncode, again.stdout, again.stderr)
    assert project.touched("R") == 1


def test_a_decision_records_the_digest_of_the_call(project: Project) -> None:
    """Approving one of two held calls records sha256 of its canonical JSON; the other stays undecided."""
    done = project.cli("run", "pair", "-p", "go")
    assert done.returncode == 3, done.stderr
    iid = project.header("pair")["instanceId"]
    p1, p2 = project.call_id("pair", "pair-0-0"), project.call_id("pair", "pair-0-1")
    decided = project.cli("approve", iid, "--call", p1)
    assert decided.returncode == 3, decided.stderr
    first, second = project.header("pair")["pendingApprovals"]
    assert (first["toolCallId"], second["toolCallId"]) == (p1, p2)
    assert first["decision"] == "approved"
    assert first["decisionDigest"] == hashlib.sha256(b'{"arguments":{"name":"P1"},"name":"touch"}').hexdigest()
    assert second.get("decision") is None
    assert second.get("decisionDigest") is None
    assert project.touched("P1") == 0  # the turn goes on once both are decided
    valid = project.cli("validate", str(project.root / "store" / iid / "instance.json"))
    assert valid.returncode == 0, valid.stdout
    assert project.cli("approve", iid, "--call", p2).returncode == 0
    assert (project.touched("P1"), project.touched("P2")) == (1, 1)


def test_two_processes_approving_one_call_at_once_run_it_once(project: Project) -> None:
    """Two ``approve ROOT --call`` at once: the call runs exactly once; the other process is refused (exit 2)."""
    root, calls = _held(project)
    procs = [subprocess.Popen([sys.executable, "-m", "loopwright.cli", "approve", root, "--call", calls["grand"]],
                              cwd=project.root, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outcomes = [(p.wait(timeout=TIMEOUT), p.communicate()[1]) for p in procs]
    codes = sorted(code for code, _err in outcomes)
    assert codes == [2, 3], outcomes
    assert project.touched("G") == 1


# ------------------------------------------------------------------------------------------
# 3. The tree, seen
# ------------------------------------------------------------------------------------------


def test_show_draws_the_tree_and_ls_tree_draws_every_tree(project: Project) -> None:
    """``show`` draws each instance with state, turns, approvals and subtree cost; ``ls --tree`` every tree."""
    root, _calls = _held(project)
    solo = project.cli("run", "solo", "-p", "go")
    assert solo.returncode == 3
    shown = project.cli("show", root)
    assert shown.returncode == 0, shown.stderr
    grand = project.header("grand")["instanceId"]
    assert f"grand {grand}, waiting_for_approval, 1 turn, 1 pending approval, subtree cost" in shown.stdout
    assert "waiting on 1 below" in shown.stdout
    # Every call held below is shown with the digest a decision on it carries (--digest, or over HTTP).
    held = project.cli_json("show", root)["treePendingApprovals"]
    assert held
    for p in held:
        assert f"{p['toolCallId']} {p['tool']} " in shown.stdout
        assert f"digest {p['digest']}\n" in shown.stdout
    listed = project.cli("ls", "--tree")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].startswith(f"root {root}, running")
    assert any(line.startswith("solo ") for line in lines)
    assert any("└─ grand" in line for line in lines), listed.stdout
    trees = project.cli_json("ls", "--tree")
    assert [t["name"] for t in trees] == ["root", "solo"]
    (middle,) = [c for c in trees[0]["children"] if c["name"] == "middle"]
    assert [c["name"] for c in middle["children"]] == ["grand"]
    assert middle["waitingOn"] == 1
    assert trees[0]["waitingOn"] == 2


def test_the_tree_shows_no_raw_control_characters(project: Project) -> None:
    """A definition name with an ANSI escape and a line break is escaped in ``show`` and ``ls --tree``."""
    (project.root / "agents" / "solo.yaml").write_text(json.dumps(
        {"name": "solo\x1b[2J\nfake line", "model": "tree:solo", "tools": ["touch"], "requiresApproval": ["touch"]}))
    done = project.cli("run", "solo", "-p", "go")
    assert done.returncode == 3, done.stderr
    listed = project.cli("ls", "--tree")
    assert "\x1b" not in listed.stdout
    assert "\\x1b[2J\\nfake line" in listed.stdout
    assert len(listed.stdout.splitlines()) == 1


def test_run_shows_the_agents_below_the_root_as_they_work(project: Project) -> None:
    """On a terminal, ``run`` prints each agent's calls, approvals and states under the root, indented by its
    depth; piped, the same as plain lines on stderr. Their calls are never taken for the root's own."""
    code, screen = in_terminal(project.root, "run", "root", "-p", "go", env=_env())
    assert code == 3, screen
    holder, middle, grand = (project.header(n)["instanceId"] for n in ("holder", "middle", "grand"))
    # Each line printed above the spinner starts with "erase line"; colours are dropped.
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.replace("\x1b[2K", "\n").replace("\r", "\n"))
    lines = text.splitlines()

    def agent_lines(prefix: str) -> list[str]:
        return [line.strip() for line in lines if line.startswith(prefix)]

    # depth 1 (children) by two spaces, depth 2 (the grandchild) by four
    assert any("touch waits for approval" in line for line in agent_lines(f"  └ holder {holder}")), screen
    assert any("→ run_agent_async" in line for line in agent_lines(f"  └ middle {middle}")), screen
    assert any("touch waits for approval" in line for line in agent_lines(f"    └ grand {grand}")), screen
    assert not any(line.startswith("→ touch") for line in lines), screen  # not shown as the root's call
    piped = Project(project.root.parent / "piped")
    done = piped.cli("run", "root", "-p", "go")
    assert done.returncode == 3, done.stderr
    holder, grand = (piped.header(n)["instanceId"] for n in ("holder", "grand"))
    assert f"  [holder {holder}] touch waits for approval" in done.stderr, done.stderr
    assert f"    [grand {grand}] touch waits for approval" in done.stderr, done.stderr
    assert "\x1b" not in done.stderr


# ------------------------------------------------------------------------------------------
# 5. The crash test
# ------------------------------------------------------------------------------------------

HOST = textwrap.dedent("""
    import asyncio, json, pathlib
    import loopwright

    async def main():
        async with loopwright.Runtime.from_file("loopwright.yaml") as rt:
            run = await rt.start_agent("root", prompt="go")
            store = pathlib.Path("store")
            def state(path):
                try:
                    return json.loads(path.read_text())["state"]
                except ValueError:  # an instance being created: its first header is written in place
                    return None

            def awaiting(path):  # its await_agent call is saved: the agents it started are in its log
                log = path.parent / "entries.jsonl"
                return log.exists() and '"await_agent"' in log.read_text()

            while True:
                headers = list(store.glob("*/instance.json"))
                held = [p for p in headers if state(p) == "waiting_for_approval"]
                callers = [p for p in headers if state(p) == "running"]
                if len(held) == 2 and len(callers) == 2 and all(awaiting(p) for p in callers):
                    break
                await asyncio.sleep(0.05)
            print(run.instance_id, flush=True)
            await asyncio.sleep(3600)  # still running (the root and middle wait) when it is killed

    asyncio.run(main())
""")


def test_calls_held_in_a_child_and_a_grandchild_survive_a_kill_and_are_approved_by_the_roots_id(
        project: Project) -> None:
    """The host is SIGKILLed while a child and a grandchild hold calls; two approves by the root's id, from new
    processes, run each call once and the root finishes."""
    (project.root / "host.py").write_text(HOST)
    host = subprocess.Popen([sys.executable, "host.py"], cwd=project.root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert host.stdout is not None
        root = host.stdout.readline().strip()
        assert root, host.communicate(timeout=TIMEOUT)
        host.send_signal(signal.SIGKILL)
    finally:
        host.kill()
        host.communicate(timeout=TIMEOUT)
    assert project.header("root")["state"] == "running"
    assert project.header("middle")["state"] == "running"
    waiting = project.cli_json("show", root)["treePendingApprovals"]
    by_holder = {p["path"][-1]["name"]: p["toolCallId"] for p in waiting}
    assert sorted(by_holder) == ["grand", "holder"]
    first = project.cli("approve", root, "--call", by_holder["holder"])
    assert first.returncode == 3, (first.returncode, first.stdout, first.stderr)
    assert "waiting on 1 approval in its tree" in first.stdout
    second = project.cli("approve", root, "--call", by_holder["grand"])
    assert second.returncode == 0, (second.returncode, second.stdout, second.stderr)
    assert (project.touched("A"), project.touched("G")) == (1, 1)
    final = project.header("root")
    assert (final["state"], final["text"]) == ("waiting", "root done")
    assert all(h["state"] == "waiting" for h in project.headers())


# ------------------------------------------------------------------------------------------
# 4. Rewind and fork
# ------------------------------------------------------------------------------------------


def _chat(project: Project, *lines: str) -> str:
    """Run ``chat`` on the first line and send it the others, each from a new process; return its id."""
    first = project.cli_json("run", "chat", "-p", lines[0])
    for line in lines[1:]:
        assert project.cli_json("message", first["instanceId"], line)["state"] == "waiting"
    return str(first["instanceId"])


def test_fork_at_a_turn_from_a_new_process_and_go_on_from_there(project: Project) -> None:
    """``fork ID --at 1`` makes a new resting instance with ID's history up to turn 1; it answers from there,
    and ID is unchanged."""
    iid = _chat(project, "one", "two", "three")
    done = project.cli("fork", iid, "--at", "1")
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    fork = done.stdout.strip()
    assert fork != iid
    header = json.loads((project.root / "store" / fork / "instance.json").read_text())
    original = json.loads((project.root / "store" / iid / "instance.json").read_text())
    assert header["forkedFrom"] == {"instanceId": iid, "turn": 1}
    assert header["state"] == "waiting"
    assert header["capabilities"] == original["capabilities"]
    assert header["pendingApprovals"] == []
    valid = project.cli("validate", str(project.root / "store" / fork / "instance.json"))
    assert valid.returncode == 0, valid.stdout
    went_on = project.cli_json("message", fork, "again")
    assert went_on["text"] == "seen: one|again"
    assert project.cli_json("show", iid)["tree"]["turns"] == 3
    shown = project.cli("show", fork)
    assert re.search(rf"^forked from +{iid} at turn 1$", shown.stdout, re.MULTILINE), shown.stdout
    default = project.cli("fork", iid)
    assert default.returncode == 0, default.stderr
    assert project.cli_json("message", default.stdout.strip(), "four")["text"] == "seen: one|two|three|four"


def test_rewind_goes_back_and_the_log_keeps_what_came_after(project: Project) -> None:
    """``rewind ID --to 1``: the next message continues from turn 1; the log and the records keep turns 2 and 3."""
    iid = _chat(project, "one", "two", "three")
    done = project.cli("rewind", iid, "--to", "1")
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert project.cli_json("show", iid)["tree"]["turns"] == 1
    assert project.cli_json("message", iid, "four")["text"] == "seen: one|four"
    log = (project.root / "store" / iid / "entries.jsonl").read_text()
    assert '"three"' in log
    assert '"t":"rewind"' in log
    records = project.cli("records", iid, "--kind", "rewind")
    (record,) = [json.loads(line) for line in records.stdout.splitlines()]
    assert (record["data"]["from"], record["data"]["to"]) == (3, 1)
    far = project.cli("rewind", iid, "--to", "9")
    assert far.returncode == 2
    assert "turn 9 is not in its history" in far.stderr


def test_fork_and_rewind_never_land_in_a_held_turn(project: Project) -> None:
    """A held turn (a call waiting for approval) cannot be forked at or rewound to: exit 2 with the reason."""
    done = project.cli("run", "solo", "-p", "go")
    assert done.returncode == 3
    iid = project.header("solo")["instanceId"]
    refused = project.cli("fork", iid)
    assert refused.returncode == 2, refused.stderr
    assert "that turn is held" in refused.stderr
    rewound = project.cli("rewind", iid, "--to", "1")
    assert rewound.returncode == 2, rewound.stderr
    assert "wait for approval" in rewound.stderr
    assert len(project.headers()) == 1
    assert project.cli("fork", iid, "--at", "0").returncode == 0  # before the held turn: fine


def test_a_fork_does_not_copy_agents_and_its_model_is_told_they_belong_to_the_original(project: Project) -> None:
    """Agents started after the fork point are not copied; the fork's history says they are the original's."""
    first = project.cli_json("run", "spawnchat", "-p", "hi")
    iid = first["instanceId"]
    assert project.cli_json("message", iid, "spawn")["text"] == "spawned"
    child = project.header("quiet")["instanceId"]
    done = project.cli("fork", iid, "--at", "1")
    assert done.returncode == 0, done.stderr
    fork = done.stdout.strip()
    assert [h["name"] for h in project.headers()].count("spawnchat") == 2
    assert [h["name"] for h in project.headers()].count("quiet") == 1
    header = json.loads((project.root / "store" / fork / "instance.json").read_text())
    assert header["children"] == []
    (entry,) = [json.loads(line) for line in (project.root / "store" / fork / "entries.jsonl").read_text().splitlines()]
    note = entry["messages"][-1]["content"]
    assert f"fork of instance {iid}" in note
    assert child in note
    assert "belong to it, not to you" in note
    assert "are not in this history" in note

