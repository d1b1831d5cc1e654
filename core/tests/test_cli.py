"""The ``loopwright`` command line, run as a subprocess: outputs, JSON, exit codes, approvals, Ctrl-C.

Every command runs as ``python -m loopwright.cli`` in a copy of ``cli_fixtures/``: an assembly
with a file store in ``./store`` and ``replay_plugin.py``, whose ``replay:NAME`` model plays
``scripts/NAME.json``. Subprocess start-up dominates the time, so the first command of most
tests is started ahead, a few at a time, by the module's ``early`` fixture.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers import in_terminal, runtime_id

import loopwright
from loopwright._plugins import BUILTIN_PLUGINS, ENTRY_POINT_GROUP

FIXTURES = Path(__file__).with_name("cli_fixtures")
ANSI = re.compile(r"\x1b[\[\]]")
STATUS = re.compile(r"^(?P<id>\S+): (?P<state>.+?), (?P<turns>\d+) turns?, (?P<tokens>[\d,]+) tokens "
                    r"\((?P<input>[\d,]+) in, (?P<output>[\d,]+) out\), cost (?P<cost>\S+)$", re.MULTILINE)
RESULT_KEYS = {"instanceId", "state", "stopReason", "text", "output", "usage", "cost", "subtreeCost",
               "pendingApprovals", "error"}


@attrs.frozen
class Done:
    """A finished command: exit code, stdout, stderr."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def status(self) -> re.Match[str]:
        found = STATUS.search(self.err)
        assert found, f"no status line in {self.err!r}"
        return found


def _env(*, autoload: bool = False, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    if not autoload:
        # Entry-point plugins are other engineers' moving parts; `plugins` tests them.
        env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.update(extra)
    return env


def lw(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Done:
    """Run ``loopwright ARGS`` in ``cwd`` and check what every piped command promises."""
    proc = subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=cwd, capture_output=True,
                          text=True, env=env or _env(), timeout=timeout, check=False)
    done = Done(proc.returncode, proc.stdout, proc.stderr)
    assert not ANSI.search(done.out + done.err), f"ANSI escapes in piped output: {done!r}"
    if "LOOPWRIGHT_DEBUG" not in (env or {}):
        assert "Traceback" not in done.err, done.err
    return done


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli") / "project"
    shutil.copytree(FIXTURES, root)
    (root / "notes.txt").write_text("hello file\n")
    return root


#: Commands started ahead, a few at a time, by ``early``: name -> arguments. They depend on
#: nothing but the fixtures; a name ending in "+autoload" runs with entry points loaded, one
#: ending in "+debug" with LOOPWRIGHT_DEBUG=1, and "agents/" in the name runs in that folder.
EARLY: dict[str, tuple[str, ...]] = {
    "chat": ("run", "agents/chat.yaml", "-p", "hi"),
    "chat-json": ("--json", "run", "agents/chat.yaml"),
    "agents/done": ("run", "-c", "../loopwright.yaml", "--json", "done.yaml"),
    "loop": ("run", "agents/loop.yaml"),
    "fail": ("run", "agents/fail.yaml"),
    "bad-yaml": ("run", "agents/bad-yaml.yaml"),
    "unknown-key": ("run", "agents/unknown-key.yaml"),
    "inputs": ("run", "agents/inputs.yaml", "-i", "count=3", "-i", "flag=true", "-i", "name=42",
               "-i", "notes=@notes.txt"),
    "bad-inputs": ("run", "agents/inputs.yaml", "-i", "count=three", "-i", "flag=true", "-i", "name=x"),
    "no-equals": ("run", "agents/chat.yaml", "-i", "novalue"),
    "validate-ok": ("validate", "agents/chat.yaml", "loopwright.yaml"),
    "validate-bad": ("validate", "agents/chat.yaml", "agents/unknown-key.yaml", "agents/bad-yaml.yaml"),
    "validate-json": ("validate", "--json", "agents/unknown-key.yaml", "nowhere.yaml"),
    "approve": ("run", "--json", "agents/approve.yaml"),
    "approve-text": ("run", "agents/approve.yaml"),
    "deny": ("run", "agents/approve.yaml", "--json"),
    "approve-digest": ("run", "--json", "agents/approve.yaml"),
    "chat-for-message": ("run", "agents/chat.yaml", "--json"),
    "chat-for-cancel": ("run", "agents/chat.yaml", "--json"),
    "show-unknown": ("show", "no-such-instance"),
    "missing-config": ("ls", "-c", "missing.yaml"),
    "plugins+autoload": ("plugins", "--json"),
    "plugins-text": ("plugins",),
    "hello": ("hello", "you", "--json"),
    "helo": ("helo",),
    "broken": ("-c", "broken.yaml", "run", "agents/chat.yaml"),
    "broken+debug": ("-c", "broken.yaml", "run", "agents/chat.yaml"),
}


def _early(project: Path, name: str, args: tuple[str, ...]) -> Done:
    cwd = project / "agents" if name.startswith("agents/") else project
    if name.endswith("+debug"):
        return lw(cwd, *args, env=_env(LOOPWRIGHT_DEBUG="1"))
    return lw(cwd, *args, env=_env(autoload=name.endswith("+autoload")))


@pytest.fixture(scope="module", autouse=True)
def early(project: Path) -> Iterator[dict[str, Future[Done]]]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield {name: pool.submit(_early, project, name, args) for name, args in EARLY.items()}


def first(early: dict[str, Future[Done]], name: str) -> Done:
    return early[name].result(timeout=120)


# ---------------------------------------------------------------------------------------------
# --help and laziness
# ---------------------------------------------------------------------------------------------


def test_help_imports_no_plugin_provider_or_rich(project: Path) -> None:
    """`--help` of the group and of commands imports no plugin, provider, httpx, rich or YAML machinery."""
    code = """if True:
        import sys
        from loopwright.cli import main
        for args in (["--help"], ["run", "--help"], ["approve", "-h"]):
            try:
                main(args)
            except SystemExit as exc:
                assert exc.code == 0, (args, exc.code)
        heavy = ("httpx", "rich", "ruamel", "jsonschema_rs", "loopwright_openai", "loopwright_testing",
                 "loopwright._config", "loopwright.cli._commands", "loopwright.cli._running", "loopwright.cli._steer",
                 "loopwright.cli._inspect", "loopwright.cli._serving", "loopwright.cli._checks",
                 "loopwright.cli._following", "loopwright.cli._opening", "loopwright.builtins.file_store",
                 "genai_prices")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy or m in heavy)
        assert not loaded, loaded
        print("ok")
    """
    proc = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True,
                          env=_env(autoload=True), timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: loopwright run [OPTIONS] DEFINITION" in proc.stdout
    assert "--json" in proc.stdout
    assert "-c, --config PATH" in proc.stdout
    assert proc.stdout.rstrip().endswith("ok")


# ---------------------------------------------------------------------------------------------
# run: outputs and exit codes
# ---------------------------------------------------------------------------------------------


def test_run_that_waits_prints_the_text_and_a_status_line(early: dict[str, Future[Done]]) -> None:
    """A run whose model answers without tools exits 0, prints the text, and a status line on stderr."""
    done = first(early, "chat")
    assert done.code == 0, done.err
    assert done.out == "hello there\n"
    status = done.status()
    assert status["state"] == "waiting"
    assert (status["turns"], status["tokens"], status["input"], status["output"]) == ("1", "15", "10", "5")
    assert status["cost"] == "$0.0000"


def test_json_before_the_command_prints_the_camel_case_result(early: dict[str, Future[Done]]) -> None:
    """`loopwright --json run` prints one JSON result with every camelCase key and nothing on stderr."""
    done = first(early, "chat-json")
    assert done.code == 0, done.err
    data = done.json()
    assert data.keys() >= RESULT_KEYS
    assert data["state"] == data["stopReason"] == "waiting"
    assert data["text"] == "hello there"
    assert data["usage"]["inputTokens"] == 10
    assert data["usage"]["outputTokens"] == 5
    assert data["usage"]["totalTokens"] == 15
    assert data["pendingApprovals"] == []
    assert data["error"] is None
    assert data["cost"] == data["subtreeCost"] == 0.0  # the replay provider is free
    assert done.err == ""


def test_task_complete_completes_and_options_work_after_the_command(early: dict[str, Future[Done]],
                                                                   project: Path) -> None:
    """`run -c PATH --json DEF` from another folder uses that assembly; task_complete gives completed."""
    done = first(early, "agents/done")
    assert done.code == 0, done.err
    data = done.json()
    assert (data["state"], data["stopReason"]) == ("stopped", "completed")
    assert data["text"] == "42"
    assert data["output"] == {"result": "42", "summary": "computed the answer"}
    assert (project / "store" / data["instanceId"]).is_dir()


def test_max_iterations_exits_1_with_the_error(early: dict[str, Future[Done]]) -> None:
    """Reaching maxIterations is the error state: exit 1, with the reason on stderr and plain progress lines."""
    done = first(early, "loop")
    assert done.code == 1
    assert "error: max iterations (2) reached" in done.err
    assert done.status()["state"] == "error (max_iterations)"
    assert 'turn 1: echo {"text": "again"}' in done.err
    assert "turn 2: echo -> success" in done.err
    assert done.out == ""


def test_provider_failure_exits_1_with_the_error_on_stderr(early: dict[str, Future[Done]]) -> None:
    """A provider that fails for good leaves the instance in error: exit 1 and the provider's message."""
    done = first(early, "fail")
    assert done.code == 1
    assert re.search(r"^error: .*upstream exploded$", done.err, re.MULTILINE), done.err
    assert done.out == ""


def test_invalid_yaml_exits_2_with_file_line_column(early: dict[str, Future[Done]]) -> None:
    """A definition that is not well-formed YAML is bad input: exit 2 naming file:line:column."""
    done = first(early, "bad-yaml")
    assert done.code == 2
    assert re.search(r"agents/bad-yaml\.yaml:\d+:\d+: invalid YAML", done.err), done.err
    assert len(done.err.splitlines()) == 1


def test_unknown_definition_key_exits_2_naming_it(early: dict[str, Future[Done]]) -> None:
    """An unknown key in a definition is bad input: exit 2, naming the key and where it is."""
    done = first(early, "unknown-key")
    assert done.code == 2
    assert "agents/unknown-key.yaml:3:1: unknown key 'favouriteColour'" in done.err
    assert "@ $.favouriteColour" in done.err


def test_inputs_are_typed_and_read_from_files(early: dict[str, Future[Done]]) -> None:
    """`-i` values become JSON for typed inputs, stay text for string inputs, and `@FILE` reads a file."""
    done = first(early, "inputs")
    assert done.code == 0, done.err
    assert done.out == "system says: count=3 flag=true name=42 notes=hello file\n"


def test_bad_inputs_exit_2(early: dict[str, Future[Done]]) -> None:
    """A value of the wrong type, or a pair without '=', is bad input (exit 2) with a clear message."""
    done = first(early, "bad-inputs")
    assert done.code == 2
    assert "input 'count' must be an integer" in done.err
    assert "missing required input 'notes'" in done.err
    done = first(early, "no-equals")
    assert done.code == 2
    assert "expected KEY=VALUE" in done.err


# ---------------------------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------------------------


def test_validate_valid_files_exits_0(early: dict[str, Future[Done]]) -> None:
    """`validate` says each valid file is valid, with its kind, and exits 0."""
    done = first(early, "validate-ok")
    assert done.code == 0, done.out + done.err
    assert done.out.splitlines() == ["agents/chat.yaml: valid definition", "loopwright.yaml: valid assembly"]


def test_validate_invalid_files_prints_each_problem_and_exits_2(early: dict[str, Future[Done]]) -> None:
    """`validate` prints problems as file:line:column: message @ $.path and exits 2; --json lists them."""
    done = first(early, "validate-bad")
    assert done.code == 2
    lines = done.out.splitlines()
    assert lines[0] == "agents/chat.yaml: valid definition"
    assert any(re.fullmatch(r"agents/unknown-key\.yaml:3:1: unknown key 'favouriteColour' .* @ \$\.favouriteColour",
                            line) for line in lines), lines
    assert any(re.match(r"agents/bad-yaml\.yaml:\d+:\d+: invalid YAML", line) for line in lines), lines
    assert "2 of 3 files invalid" in done.err
    done = first(early, "validate-json")
    assert done.code == 2
    unknown, missing = done.json()
    assert (unknown["valid"], unknown["kind"]) == (False, "definition")
    assert unknown["problems"][0]["path"] == "$.favouriteColour"
    assert unknown["problems"][0]["line"] == 3
    assert "cannot read" in missing["problems"][0]["message"]


# ---------------------------------------------------------------------------------------------
# approvals, messages, cancel, resume: continuing an instance in a new process
# ---------------------------------------------------------------------------------------------


def call_id(project: Path, instance_id: str, model_id: str) -> str:
    """Return the runtime's id of the call the model named ``model_id`` in the instance's saved transcript."""
    entries = (project / "store" / instance_id / "entries.jsonl").read_text().splitlines()
    calls = [loopwright.ToolCall(id=c["id"], name=c["name"], arguments=c.get("arguments", {}),
                                 wire_id=c.get("wireId"))
             for line in entries if (entry := json.loads(line)).get("t") == "msg"
             for c in entry["m"].get("toolCalls", [])]
    return runtime_id(calls, model_id)


def held_call(project: Path, instance_id: str, model_id: str) -> tuple[str, dict[str, Any]]:
    """Return the runtime's id of the call the model named ``model_id``, held now, and its saved pending entry."""
    call = call_id(project, instance_id, model_id)
    header = json.loads((project / "store" / instance_id / "instance.json").read_text())
    pending = [p for p in header["pendingApprovals"] if p["toolCallId"] == call]
    assert len(pending) == 1, header["pendingApprovals"]
    return call, pending[0]


@pytest.fixture(scope="module")
def approved(early: dict[str, Future[Done]], project: Path) -> tuple[Done, Done]:
    held = first(early, "approve")
    assert held.code == 3, held.err
    return held, lw(project, "approve", held.json()["instanceId"])


def test_requires_approval_exits_3_with_pending_approvals(approved: tuple[Done, Done], project: Path) -> None:
    """A call to a tool with requires_approval holds the run: exit 3, pendingApprovals in --json.

    The held call goes by the runtime's id of the model's ``call_del``, with the digest a decision must carry.
    """
    held, done = approved
    data = held.json()
    assert (data["state"], data["stopReason"]) == ("waiting_for_approval", "waiting_for_approval")
    iid = data["instanceId"]
    call = call_id(project, iid, "call_del")
    assert [(p["toolCallId"], p["tool"], p["arguments"]) for p in data["pendingApprovals"]] == [
        (call, "delete", {"path": "old/notes.txt"})]
    (pending,) = data["pendingApprovals"]
    assert re.fullmatch(r"[0-9a-f]{64}", pending["digest"]), pending
    # The digest shown is the one the decision was bound to (`approve` prints what it decided).
    assert f'approved: {call} delete {{"path": "old/notes.txt"}} (in {iid}; digest {pending["digest"]})' in done.err


def test_approve_in_a_new_process_continues_to_rest(approved: tuple[Done, Done]) -> None:
    """`approve ID` runs the held call and follows the instance until it rests, exiting 0."""
    held, done = approved
    assert done.code == 0, done.err
    assert done.out == "result: deleted old/notes.txt\n"
    assert done.status()["id"] == held.json()["instanceId"]
    assert "turn 1: delete -> success" in done.err


def test_run_text_output_says_how_to_approve(early: dict[str, Future[Done]], project: Path) -> None:
    """Without --json a held run lists the calls with ids, arguments and digests, and the approve command."""
    done = first(early, "approve-text")
    assert done.code == 3
    iid = done.status()["id"]
    call, pending = held_call(project, iid, "call_del")
    assert f'\n  {call}  delete {{"path": "old/notes.txt"}}\n      digest {loopwright.approval_digest(pending)}\n' \
        in done.out
    assert f"approve with: loopwright approve {iid}" in done.out
    assert "turn 1: delete waits for approval" in done.err


def test_deny_with_a_reason_gives_the_model_a_denied_result(early: dict[str, Future[Done]], project: Path) -> None:
    """`deny ID --reason` answers the held call with 'denied: REASON', which the model reads."""
    held = first(early, "deny")
    assert held.code == 3
    iid = held.json()["instanceId"]
    call, _pending = held_call(project, iid, "call_del")
    done = lw(project, "deny", iid, "--call", call, "--reason", "too risky", "--json")
    assert done.code == 0, done.err
    assert done.json()["text"] == "result: denied: too risky"
    again = lw(project, "approve", iid)
    assert again.code == 2
    assert f"instance {iid} is waiting, not waiting for approval" in again.err


def test_approve_with_a_wrong_digest_runs_nothing_and_the_right_one_runs_the_call(
        early: dict[str, Future[Done]], project: Path) -> None:
    """`approve ID --call CALL --digest WRONG` exits 2 naming the current digest and decides and runs nothing;
    `show` prints the digest; `--digest` with the digest shown runs the call and follows the instance to rest."""
    held = first(early, "approve-digest")
    assert held.code == 3, held.err
    iid = held.json()["instanceId"]
    call, pending = held_call(project, iid, "call_del")
    digest = loopwright.approval_digest(pending)
    assert held.json()["pendingApprovals"][0]["digest"] == digest
    wrong = "0" * 64
    refused = lw(project, "approve", iid, "--call", call, "--digest", wrong)
    assert refused.code == 2, refused
    assert f"digest {digest}, not the digest {wrong}" in refused.err
    assert "nothing was decided" in refused.err
    assert refused.out == ""
    shown = lw(project, "show", iid, "--json").json()
    assert shown["state"] == "waiting_for_approval"
    assert [(p["toolCallId"], p["decision"], p["digest"]) for p in shown["pendingApprovals"]] == [
        (call, None, digest)]
    # `show` as text prints the digest under the held call, as `run` did: what `--digest` takes.
    text = lw(project, "show", iid)
    assert text.code == 0, text.err
    assert re.search(rf'^pending approval +{call} delete {{"path": "old/notes.txt"}}\n +digest {digest}$',
                     text.out, re.MULTILINE), text.out
    assert lw(project, "records", iid, "--kind", "tool_call", "--json").out == ""  # the call never ran
    done = lw(project, "approve", iid, "--call", call, "--digest", digest)
    assert done.code == 0, done.err
    assert done.out == "result: deleted old/notes.txt\n"
    assert f'approved: {call} delete {{"path": "old/notes.txt"}} (in {iid}; digest {digest})' in done.err
    records = lw(project, "records", iid, "--kind", "tool_call", "--json")
    (ran,) = [json.loads(line) for line in records.out.splitlines()]
    assert (ran["data"]["toolCallId"], ran["data"]["status"]) == (call, "success")


def test_message_continues_a_waiting_instance_in_a_new_process(early: dict[str, Future[Done]],
                                                               project: Path) -> None:
    """`message ID TEXT` delivers the text and follows the instance to rest, printing as run does."""
    iid = first(early, "chat-for-message").json()["instanceId"]
    done = lw(project, "message", iid, "again")
    assert done.code == 0, done.err
    assert done.out == "you said: again\n"
    assert done.status()["turns"] == "2"


def test_cancel_marks_the_instance_stopped_and_cancelled(early: dict[str, Future[Done]], project: Path) -> None:
    """`cancel ID` leaves the instance stopped with cancelled true, prints the result and exits 0."""
    iid = first(early, "chat-for-cancel").json()["instanceId"]
    done = lw(project, "cancel", "--json", iid)
    assert done.code == 0, done.err
    data = done.json()
    assert (data["state"], data["stopReason"], data["cancelled"]) == ("stopped", "cancelled", True)


def test_ctrl_c_cancels_the_run_and_saves_it(project: Path) -> None:
    """SIGINT during `run` cancels it: exit 130, a hint on stderr, the instance stopped and cancelled."""
    marker = project / "slow.started"
    marker.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "loopwright.cli", "run", "agents/slow.yaml"], cwd=project,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the slow tool never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    iid = STATUS.search(err)["id"]  # type: ignore[index]
    assert f"cancelled; resume with: loopwright message {iid}" in err
    assert "Traceback" not in err
    assert out == ""
    shown = lw(project, "show", iid, "--json").json()
    assert (shown["state"], shown["stopReason"], shown["cancelled"]) == ("stopped", "cancelled", True)


def test_resume_continues_an_instance_left_running_by_a_crash(project: Path) -> None:
    """After SIGKILL mid-tool the instance stays running; `resume ID` repairs the call and goes on."""
    marker = project / "slow.started"
    marker.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "loopwright.cli", "--json", "run", "agents/slow.yaml"],
                            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the slow tool never started"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.communicate()
    running = [s for s in lw(project, "ls", "--state", "running", "--json").json() if s["name"] == "slow"]
    assert len(running) == 1
    done = lw(project, "resume", running[0]["instanceId"])
    assert done.code == 0, done.err
    assert done.out.startswith("after slow: the call was interrupted")
    assert "turn 1: slow -> unknown_outcome" in done.err


# ---------------------------------------------------------------------------------------------
# show, ls, records
# ---------------------------------------------------------------------------------------------


def test_show_json_is_one_summary(approved: tuple[Done, Done], project: Path) -> None:
    """`show ID --json` prints the instance summary: state, usage, cost, approvals, links, children."""
    iid = approved[0].json()["instanceId"]
    data = lw(project, "show", iid, "--json").json()
    assert data["instanceId"] == iid
    assert (data["state"], data["stopReason"]) == ("waiting", "waiting")
    assert data["usage"]["totalTokens"] == 30
    assert data["pendingApprovals"] == []
    for key in ("cost", "subtreeCost", "spawnerInstanceId", "callerInstanceId", "callerToolCallId", "children"):
        assert key in data


def test_show_text_and_ls_are_plain_when_piped(approved: tuple[Done, Done], project: Path) -> None:
    """Piped, `show` prints aligned key-value lines and `ls` aligned columns, without escapes."""
    iid = approved[0].json()["instanceId"]
    shown = lw(project, "show", iid)
    assert shown.code == 0
    assert re.search(rf"^instance +{iid}$", shown.out, re.MULTILINE)
    assert re.search(r"^tokens +30 \(20 in, 10 out\)$", shown.out, re.MULTILINE)
    listed = lw(project, "ls")
    assert listed.code == 0
    header, *rows = listed.out.splitlines()
    assert header.split()[:5] == ["ID", "NAME", "STATE", "TOKENS", "COST"]
    assert any(r.startswith(iid) and " approve " in r for r in rows)


def test_ls_json_filters_by_state(approved: tuple[Done, Done], project: Path) -> None:
    """`ls --state S --json` lists only summaries in that state."""
    data = lw(project, "ls", "--json", "--state", "waiting").json()
    assert data
    assert {s["state"] for s in data} == {"waiting"}
    assert approved[0].json()["instanceId"] in {s["instanceId"] for s in data}


def test_records_are_json_lines_with_kind_and_tool_status(approved: tuple[Done, Done], project: Path) -> None:
    """`records ID` prints one JSON record per line, each with a kind; tool_call records carry status."""
    iid = approved[0].json()["instanceId"]
    done = lw(project, "records", iid)
    assert done.code == 0
    records = [json.loads(line) for line in done.out.splitlines()]
    assert all(r["kind"] and r["instanceId"] == iid for r in records)
    kinds = [r["kind"] for r in records]
    assert {"state", "turn", "approval", "tool_call"} <= set(kinds)
    assert [r["data"]["status"] for r in records if r["kind"] == "tool_call"] == ["success"]


def test_unknown_instance_or_config_is_bad_input(early: dict[str, Future[Done]]) -> None:
    """An unknown instance id, or a -c file that does not exist, exits 2 with a clear message."""
    done = first(early, "show-unknown")
    assert done.code == 2
    assert "no instance 'no-such-instance' in the store" in done.err
    done = first(early, "missing-config")
    assert done.code == 2
    assert "assembly file 'missing.yaml' given with -c/--config does not exist" in done.err


# ---------------------------------------------------------------------------------------------
# plugins and plugin commands
# ---------------------------------------------------------------------------------------------


def test_plugins_lists_builtins_entry_points_and_assembly_plugins(early: dict[str, Future[Done]]) -> None:
    """`plugins --json` lists every plugin in load order with what it registered and its hooks."""
    done = first(early, "plugins+autoload")
    assert done.code == 0, done.err
    plugins = done.json()
    names = [p["name"] for p in plugins]
    assert names[: len(BUILTIN_PLUGINS)] == list(BUILTIN_PLUGINS)
    entry_points = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert entry_points <= set(names)
    assert all(p["source"] == "entrypoint" for p in plugins if p["name"] in entry_points)
    by_name = {p["name"]: p for p in plugins}
    assert by_name["loopwright.builtins.tools"]["registered"]["tools"] == [
        "ask_user", "await_agent", "await_monitor", "list_agent_instances", "message_agent", "monitor_agent",
        "query_agent", "run_agent_async", "task_complete", "todowrite"]
    assert by_name["loopwright.builtins.file_store"]["registered"]["stores"] == ["file"]
    replay = by_name["replay_plugin.py"]
    assert names[-1] == "replay_plugin.py"
    assert replay["source"] == "assembly"
    assert replay["registered"]["providers"] == ["replay"]
    assert replay["registered"]["tools"] == ["delete", "echo", "slow"]
    assert replay["registered"]["commands"] == ["hello"]
    assert replay["hooks"] == ["on_state_change"]
    text = first(early, "plugins-text")
    assert ("loopwright.builtins.tools (builtin)\n  tools: ask_user, await_agent, await_monitor, list_agent_instances, "
            "message_agent, monitor_agent, query_agent, run_agent_async, task_complete, todowrite\n") in text.out


def test_plugin_commands_are_found_by_name_with_common_options(early: dict[str, Future[Done]]) -> None:
    """A command a plugin registers runs by name and takes --json; an unknown one exits 2."""
    done = first(early, "hello")
    assert done.code == 0, done.err
    assert done.json() == {"hello": "you"}
    done = first(early, "helo")
    assert done.code == 2
    assert "No such command 'helo'" in done.err


def test_python_errors_print_one_line_unless_debugging(early: dict[str, Future[Done]]) -> None:
    """A plugin that fails to import gives a one-line error (exit 2); LOOPWRIGHT_DEBUG=1 shows the traceback."""
    done = first(early, "broken")
    assert done.code == 2
    assert len(done.err.splitlines()) == 1
    assert done.err.startswith("error: plugin 'broken_plugin.py'")
    assert "broken on purpose" in done.err
    debug = first(early, "broken+debug")
    assert "Traceback" in debug.err


# ---------------------------------------------------------------------------------------------
# A terminal
# ---------------------------------------------------------------------------------------------


def _in_terminal(cwd: Path, *args: str) -> tuple[int, str]:
    return in_terminal(cwd, *args, env=_env())


def test_live_progress_on_a_terminal(project: Path) -> None:
    """On a terminal `run` shows rich live progress: tool calls, the turn, tokens; then the status."""
    code, screen = _in_terminal(project, "run", "agents/loop.yaml")
    assert code == 1
    assert ANSI.search(screen)
    assert "→ echo" in screen
    assert "turn 2 · 2 tool calls · 30 tokens" in screen
    assert "error: max iterations (2) reached" in screen
