"""Attacks 1 and 2 of issue 8: code from a definition file, and gates a child drops.

Each test plays the malicious model with the ``scripted`` provider through the CLI, as a user
runs it: ``python -m loopwright.cli`` with the assembly's folder as the working folder, so that
folder is ``sys.path[0]`` and anything an agent writes under ``./work`` is importable as
``work.NAME``. The model's files (a module and a child definition) are written into its write
root as the model would write them (one test writes them through ``write-file``).

Code that must never run leaves a ``PWNED`` file; tools that must not run unasked leave
``touched-NAME`` / ``noted-NAME`` files. Each test fails if the attack succeeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

#: Tools whose calls leave a marker file beside the assembly (the side effect the tests watch).
HOST_PLUGIN = textwrap.dedent('''
    import pathlib
    import loopwright

    HERE = pathlib.Path(__file__).parent

    @loopwright.tool(parallel_safe=False)
    def touch(name: str) -> str:
        """Leave the marker touched-NAME.

        Args:
            name: The marker.
        """
        (HERE / f"touched-{name}").write_text("x")
        return f"touched {name}"

    @loopwright.tool(parallel_safe=False)
    def note(name: str) -> str:
        """Leave the marker noted-NAME.

        Args:
            name: The marker.
        """
        (HERE / f"noted-{name}").write_text("x")
        return f"noted {name}"

    @loopwright.hookimpl
    def loopwright_register_tools(register):
        register(touch, note)
''')

#: Components registered by name: what a definition may name instead of code.
NAMED_PLUGIN = textwrap.dedent("""
    import loopwright

    def no_touch(call):
        return "touch is not allowed here" if call.name == "touch" else None

    def boom(call):
        raise RuntimeError("guardrail exploded")

    def explode(messages):
        raise RuntimeError("verifier exploded")

    class Raising:
        @loopwright.hookimpl
        def loopwright_before_tool_call(self, call):
            raise RuntimeError("hook exploded")

    class NoTouch:
        @loopwright.hookimpl
        def loopwright_before_tool_call(self, call):
            return loopwright.Block("no touching (hook)") if call.name == "touch" else None

    @loopwright.hookimpl
    def loopwright_register_guardrails(register):
        register("no_touch", no_touch)
        register("boom", boom)

    @loopwright.hookimpl
    def loopwright_register_verifiers(register):
        register("explode", explode)

    @loopwright.hookimpl
    def loopwright_register_hooks(register):
        register("raising", Raising())
        register("no_touch_hooks", NoTouch())
""")

#: What the model writes into its root: importing it, or calling any of it, leaves PWNED.
EVIL = textwrap.dedent("""
    import pathlib
    import loopwright

    PWNED = pathlib.Path(__file__).resolve().parent.parent / "PWNED"
    PWNED.write_text("imported")

    def guard(*args, **kwargs):
        PWNED.write_text("guard ran")

    def verify(*args, **kwargs):
        PWNED.write_text("verifier ran")
        return True, ""

    @loopwright.hookimpl
    def loopwright_before_tool_call(call):
        PWNED.write_text("hook ran")
""")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.pop("PYTHONPATH", None)
    return env


class Project:
    """An assembly folder: ``loopwright.yaml``, the host plugins, ``agents/`` and the write root ``work/``."""

    def __init__(self, root: Path, *, named: bool = False) -> None:
        self.root = root
        self.work = root / "work"
        self.work.mkdir(parents=True)
        (root / "agents").mkdir()
        (root / "host.py").write_text(HOST_PLUGIN)
        self.plugins = ["testing", "os", "host.py"]
        if named:
            (root / "named.py").write_text(NAMED_PLUGIN)
            self.plugins.append("named.py")
        self.providers: dict[str, list[Any]] = {}
        self.extra: dict[str, Any] = {}

    def assembly(self, **providers: list[Any]) -> None:
        """(Re)write ``loopwright.yaml`` with a scripted provider per keyword (model ``NAME:any``)."""
        self.providers.update(providers)
        data = {
            "store": {"kind": "file", "path": str(self.root / "store")},
            "plugins": self.plugins,
            "capabilities": {"files": {"read": [str(self.work)], "write": [str(self.work)]}, "shell": "none",
                             "agents": {"spawn": True, "maxDepth": 4}},
            "providers": {name: {"kind": "scripted", "replies": replies} for name, replies in self.providers.items()},
            **self.extra,
        }
        (self.root / "loopwright.yaml").write_text(json.dumps(data, indent=1))

    def agent(self, where: str, **definition: Any) -> str:
        """Write a definition (JSON is YAML) at ``where`` under the project; return ``where``."""
        path = self.root / where
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(definition, indent=1))
        return where

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=self.root, capture_output=True,
                              text=True, env=_env(), timeout=timeout, check=False)

    def headers(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.root / "store").glob("*/instance.json"))]

    def header(self, name: str) -> dict[str, Any]:
        found = [h for h in self.headers() if h["name"] == name]
        assert len(found) == 1, [h["name"] for h in self.headers()]
        return found[0]

    def records(self, name: str) -> list[dict[str, Any]]:
        done = self.cli("records", self.header(name)["instanceId"])
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]

    def tool_results(self, name: str, tool: str) -> list[dict[str, Any]]:
        return [r["data"] for r in self.records(name) if r["kind"] == "tool_call" and r["data"].get("tool") == tool]

    @property
    def pwned(self) -> bool:
        return (self.root / "PWNED").exists()


def call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    return {"name": tool, "arguments": arguments}


def calls(*items: dict[str, Any]) -> dict[str, Any]:
    return {"toolCalls": list(items)}


def start_child(uri: str = "work/child.yaml") -> dict[str, Any]:
    return calls(call("run_agent_async", agentSwarmUri=uri, prompt="go"))


PARENT_TOOLS = ["touch", "note", "run_agent_async", "task_complete"]


def spawner(project: Project, **gates: Any) -> str:
    """A host definition whose model starts ``work/child.yaml`` and then rests."""
    return project.agent("agents/parent.yaml", name="parent", model="parent:any", tools=PARENT_TOOLS, **gates)


def assert_refused(project: Project, done: subprocess.CompletedProcess[str], needle: str) -> None:
    """The run survived, the child was not started, and the model was told why."""
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert not project.pwned, (project.root / "PWNED").read_text()
    [result] = project.tool_results("parent", "run_agent_async")
    assert result["status"] == "tool_error", result
    assert needle in result["error"], result
    assert [h["name"] for h in project.headers()] == ["parent"]


# ------------------------------------------------------------------------------------------
# 1. A definition file names no code
# ------------------------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path / "project")


def _evil_child(project: Project, **keys: Any) -> None:
    (project.work / "evil.py").write_text(EVIL)
    project.agent("work/child.yaml", name="child", model="child:any", tools=["touch"], **keys)
    project.assembly(parent=[start_child(), "started"], child=[calls(call("touch", name="child")), "done"])


def test_hooks_by_dotted_path_import_nothing(project: Project) -> None:
    """``hooks: [work.evil]`` in a model-written file: the module is never imported."""
    _evil_child(project, hooks=["work.evil"])
    assert_refused(project, project.cli("run", spawner(project), "-p", "go"), "work.evil")


def test_guardrail_module_function_imports_nothing(project: Project) -> None:
    """``guardrails: ["work.evil:guard"]``: nothing is imported, nothing runs."""
    _evil_child(project, guardrails=["work.evil:guard"])
    assert_refused(project, project.cli("run", spawner(project), "-p", "go"), "work.evil:guard")


def test_guardrail_os_abort_does_not_kill_the_runtime(project: Project) -> None:
    """``guardrails: ["os:abort"]`` killed the process with SIGABRT, and every resume and worker again."""
    _evil_child(project, guardrails=["os:abort"])
    done = project.cli("run", spawner(project), "-p", "go")
    assert done.returncode != -6, "the runtime died of SIGABRT"
    assert_refused(project, done, "os:abort")
    for header in project.headers():
        again = project.cli("resume", header["instanceId"])
        assert again.returncode == 0, (again.returncode, again.stderr)
    worker = project.cli("worker", "--once")
    assert worker.returncode == 0, (worker.returncode, worker.stderr)
    assert not project.pwned


def test_completion_verify_names_no_code(project: Project) -> None:
    """``completion.verify`` naming a function of the model's module is refused at the start."""
    _evil_child(project, completion={"verify": "work.evil:verify", "maxAttempts": 1})
    assert_refused(project, project.cli("run", spawner(project), "-p", "go"), "work.evil:verify")


@pytest.mark.parametrize("keys", [{"hooks": ["work/evil.py"]}, {"guardrails": ["work/evil.py:guard"]},
                                  {"completion": {"verify": "work/evil.py:verify", "maxAttempts": 1}}],
                         ids=["hooks", "guardrails", "verify"])
def test_py_paths_are_refused(project: Project, keys: dict[str, Any]) -> None:
    """A ``.py`` path in any code-naming key is refused and never executed."""
    _evil_child(project, **keys)
    done = project.cli("run", spawner(project), "-p", "go")
    assert done.returncode == 0, done.stderr
    assert not project.pwned
    [result] = project.tool_results("parent", "run_agent_async")
    assert result["status"] == "tool_error", result


#: A module of the assembly's ``plugins:`` (trusted code), whose functions leave PWNED when called.
POLICIES = textwrap.dedent("""
    import pathlib
    import loopwright

    PWNED = pathlib.Path(__file__).resolve().parent / "PWNED"

    def pwn(*args, **kwargs):
        PWNED.write_text("a function of a plugin module ran on a model's say-so")

    def verify(*args, **kwargs):
        PWNED.write_text("verifier ran")
        return True, ""
""")


@pytest.mark.parametrize("keys", [{"guardrails": ["policies:pwn"]}, {"hooks": ["otel"]},
                                  {"completion": {"verify": "policies:verify", "maxAttempts": 1}}],
                         ids=["guardrails", "hooks", "verify"])
def test_a_definition_file_cannot_name_a_plugin_module_by_dotted_path(project: Project, keys: dict[str, Any]) -> None:
    """A host definition may name ``policies:pwn`` (a function of a module of the assembly's plugins) and an
    installed entry point (``otel``, not loaded here) as a hook set; a definition the model wrote may not: only
    registered names, so no function of trusted code runs, and no package is loaded, on a model's say-so."""
    (project.root / "policies.py").write_text(POLICIES)
    project.plugins.append("policies")
    project.agent("work/child.yaml", name="child", model="child:any", tools=["touch", "task_complete"], **keys)
    project.assembly(parent=[start_child(), "started"], child=[calls(call("touch", name="child")), "done"])
    assert_refused(project, project.cli("run", spawner(project), "-p", "go"), "names code only by registered name")


def test_model_writes_module_and_definition_through_write_file(project: Project) -> None:
    """The whole attack by the model: write-file the module and the definition, then start it."""
    child = json.dumps({"name": "child", "model": "child:any", "tools": ["touch"], "hooks": ["work.evil"],
                        "guardrails": ["work.evil:guard"]})
    project.agent("agents/parent.yaml", name="parent", model="parent:any", tools=[*PARENT_TOOLS, "write-file"])
    project.assembly(
        parent=[calls(call("write-file", path=str(project.work / "evil.py"), content=EVIL),
                      call("write-file", path=str(project.work / "child.yaml"), content=child)),
                start_child(), "started"],
        child=[calls(call("touch", name="child")), "done"])
    done = project.cli("run", "agents/parent.yaml", "-p", "go")
    assert (project.work / "evil.py").is_file()
    assert_refused(project, done, "work.evil")


def test_registered_names_work_in_a_definition_file(tmp_path: Path) -> None:
    """What a file may name instead: a guardrail registered by name blocks the child's call."""
    project = Project(tmp_path / "p", named=True)
    project.agent("work/child.yaml", name="child", model="child:any", tools=["touch"], guardrails=["no_touch"])
    project.assembly(parent=[start_child(), "started"], child=[calls(call("touch", name="child")), "done"])
    done = project.cli("run", spawner(project), "-p", "go")
    assert done.returncode == 0, done.stderr
    assert not (project.root / "touched-child").exists()
    [result] = project.tool_results("child", "touch")
    assert result["status"] == "blocked"
    assert "touch is not allowed here" in result["error"]


def test_host_definition_imports_modules_only_from_the_assembly_plugins(project: Project) -> None:
    """A host definition naming a module on sys.path[0] (the working folder) but not in plugins: is refused."""
    (project.root / "evil_host.py").write_text(EVIL.replace('.parent.parent / "PWNED"', '.parent / "PWNED"'))
    project.assembly(solo=[calls(call("touch", name="solo")), "done"])
    for keys in ({"guardrails": ["evil_host:guard"]}, {"hooks": ["evil_host"]}):
        project.agent("agents/solo.yaml", name="solo", model="solo:any", tools=["touch"], **keys)
        done = project.cli("run", "agents/solo.yaml", "-p", "go")
        assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
        assert "evil_host" in done.stderr
        assert not project.pwned
        assert not (project.root / "touched-solo").exists()


def test_host_definition_may_name_a_module_of_the_assembly_plugins(project: Project) -> None:
    """The same reference works once the assembly lists the module in plugins: (the host's choice)."""
    (project.root / "policies.py").write_text(
        "def no_touch(call):\n    return 'no touching' if call.name == 'touch' else None\n")
    project.plugins.append("policies")
    project.assembly(solo=[calls(call("touch", name="solo")), "done"])
    project.agent("agents/solo.yaml", name="solo", model="solo:any", tools=["touch"], guardrails=["policies:no_touch"])
    done = project.cli("run", "agents/solo.yaml", "-p", "go")
    assert done.returncode == 0, done.stderr
    assert not (project.root / "touched-solo").exists()
    [result] = project.tool_results("solo", "touch")
    assert result["status"] == "blocked"
    assert "no touching" in result["error"]


@pytest.mark.parametrize(("keys", "needle"), [
    ({"guardrails": ["boom"]}, "guardrail exploded"),
    ({"hooks": ["raising"]}, "hook exploded"),
], ids=["guardrail", "hook"])
def test_a_raising_guardrail_or_hook_fails_closed(tmp_path: Path, keys: dict[str, Any], needle: str) -> None:
    """A registered guardrail or hook that raises blocks the call, with a record; the process lives."""
    project = Project(tmp_path / "p", named=True)
    project.agent("work/child.yaml", name="child", model="child:any", tools=["touch"], **keys)
    project.assembly(parent=[start_child(), "started"], child=[calls(call("touch", name="child")), "done"])
    done = project.cli("run", spawner(project), "-p", "go")
    assert done.returncode == 0, done.stderr
    assert not (project.root / "touched-child").exists()
    [result] = project.tool_results("child", "touch")
    assert result["status"] == "blocked"
    hooks = [r["data"] for r in project.records("child") if r["kind"] == "hook"]
    assert any(needle in h.get("error", "") for h in hooks), hooks
    assert project.header("child")["state"] == "waiting"


def test_a_raising_verifier_fails_closed(tmp_path: Path) -> None:
    """A verifier that raises does not pass the gate: the child is re-prompted, then ends; the process lives."""
    project = Project(tmp_path / "p", named=True)
    project.agent("work/child.yaml", name="child", model="child:any", tools=["task_complete"],
                  completion={"verify": "explode", "maxAttempts": 1})
    project.assembly(parent=[start_child(), "started"],
                     child=[calls(call("task_complete", result="r", summary="s")), "done"])
    done = project.cli("run", spawner(project), "-p", "go")
    assert done.returncode == 0, done.stderr
    child = project.header("child")
    assert child["state"] == "error"
    assert child["stopReason"] == "limit_exceeded"
    assert "verifier exploded" in child["error"]
    checks = [r["data"] for r in project.records("child") if r["kind"] == "completion"]
    assert checks
    assert checks[0]["ok"] is False
    assert "verifier exploded" in checks[0]["error"]


_BAD_SIGNATURES = {
    "hook": """
        class Bad:
            @loopwright.hookimpl
            def loopwright_before_tool_call(self, nonsense):
                return None

        @loopwright.hookimpl
        def loopwright_register_hooks(register):
            register("bad", Bad())
    """,
    "guardrail": """
        def bad(nonsense):
            return None

        @loopwright.hookimpl
        def loopwright_register_guardrails(register):
            register("bad", bad)
    """,
    "verifier": """
        def bad():
            return True, ""

        @loopwright.hookimpl
        def loopwright_register_verifiers(register):
            register("bad", bad)
    """,
}


@pytest.mark.parametrize("kind", sorted(_BAD_SIGNATURES))
def test_a_wrong_signature_is_a_load_error(project: Project, kind: str) -> None:
    """A hook set, guardrail or verifier with arguments no spec offers fails the load, naming plugin and hook."""
    (project.root / "badsig.py").write_text("import loopwright\n" + textwrap.dedent(_BAD_SIGNATURES[kind]))
    project.plugins.append("badsig.py")
    project.assembly(solo=["done"])
    project.agent("agents/solo.yaml", name="solo", model="solo:any")
    done = project.cli("run", "agents/solo.yaml", "-p", "go")
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "badsig.py" in done.stderr
    assert f"{kind} 'bad" in done.stderr.replace("hook set 'bad", "hook 'bad"), done.stderr
    assert "nonsense" in done.stderr or kind == "verifier", done.stderr
    assert "loopwright_before_tool_call" in done.stderr or kind != "hook", done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_hook_set_is_a_load_error(project: Project) -> None:
    """A host definition naming a hook set nobody registered fails the start (exit 2), naming it."""
    project.assembly(solo=["done"])
    project.agent("agents/solo.yaml", name="solo", model="solo:any", hooks=["unknown_hook_set"])
    done = project.cli("run", "agents/solo.yaml", "-p", "go")
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "unknown_hook_set" in done.stderr


# ------------------------------------------------------------------------------------------
# 2. A child runs under its caller's gates
# ------------------------------------------------------------------------------------------


def _touching_child(project: Project, **keys: Any) -> None:
    project.agent("work/child.yaml", name="child", model="child:any", tools=["touch", "note"], **keys)


def test_requires_approval_is_inherited(project: Project) -> None:
    """The parent needs approval for touch; the child it wrote without the gate still waits for it."""
    _touching_child(project)
    project.assembly(parent=[start_child(), "started"], child=[calls(call("touch", name="child")), "done"])
    done = project.cli("run", spawner(project, requiresApproval=["touch"]), "-p", "go")
    assert done.returncode == 0, done.stderr
    assert not (project.root / "touched-child").exists(), "the child ran touch unasked"
    child = project.header("child")
    assert child["state"] == "waiting_for_approval"
    assert [p["tool"] for p in child["pendingApprovals"]] == ["touch"]
    # Approving it is what runs it (the new process's script goes on after the held call).
    project.assembly(child=["done"])
    approved = project.cli("approve", child["instanceId"])
    assert approved.returncode == 0, approved.stderr
    assert (project.root / "touched-child").exists()


def test_guardrails_are_inherited(tmp_path: Path) -> None:
    """The parent runs under the guardrail no_touch; so does the child it wrote without it."""
    project = Project(tmp_path / "p", named=True)
    _touching_child(project)
    project.assembly(parent=[start_child(), "started"], child=[calls(call("touch", name="child")), "done"])
    done = project.cli("run", spawner(project, guardrails=["no_touch"]), "-p", "go")
    assert done.returncode == 0, done.stderr
    assert not (project.root / "touched-child").exists(), "the child dropped its caller's guardrail"
    [result] = project.tool_results("child", "touch")
    assert result["status"] == "blocked"


def test_definition_hooks_are_inherited(tmp_path: Path) -> None:
    """The hooks the parent runs under (a hook set) apply to the child too."""
    project = Project(tmp_path / "p", named=True)
    _touching_child(project)
    project.assembly(parent=[start_child(), "started"], child=[calls(call("touch", name="child")), "done"])
    done = project.cli("run", spawner(project, hooks=["no_touch_hooks"]), "-p", "go")
    assert done.returncode == 0, done.stderr
    assert not (project.root / "touched-child").exists(), "the child dropped its caller's hooks"
    [result] = project.tool_results("child", "touch")
    assert result["status"] == "blocked"


def test_approval_policy_is_inherited(project: Project) -> None:
    """The parent holds whole turns (holdTurn); the child's turn with a held call holds its other calls too."""
    _touching_child(project, requiresApproval=["touch"])
    project.assembly(parent=[start_child(), "started"],
                     child=[calls(call("touch", name="child"), call("note", name="child")), "done"])
    done = project.cli("run", spawner(project, approvalPolicy="holdTurn"), "-p", "go")
    assert done.returncode == 0, done.stderr
    assert not (project.root / "noted-child").exists(), "the child's turn was not held (perCall)"
    child = project.header("child")
    assert sorted(p["tool"] for p in child["pendingApprovals"]) == ["note", "touch"]


def test_grandchild_inherits_too(project: Project) -> None:
    """All the way down: a grandchild written by an ungated child still runs under the root's gates."""
    project.agent("work/child.yaml", name="child", model="child:any", tools=["touch", "run_agent_async"])
    project.agent("work/grand.yaml", name="grand", model="grand:any", tools=["touch"])
    project.assembly(parent=[start_child(), "started"], child=[start_child("work/grand.yaml"), "started"],
                     grand=[calls(call("touch", name="grand")), "done"])
    done = project.cli("run", spawner(project, requiresApproval=["touch"]), "-p", "go")
    assert done.returncode == 0, done.stderr
    assert not (project.root / "touched-grand").exists(), "the grandchild ran touch unasked"
    assert project.header("grand")["state"] == "waiting_for_approval"


def test_a_registered_child_inherits(project: Project) -> None:
    """A definition registered in agentDefinitions chooses its tools, but not to shed its caller's gates."""
    project.agent("agents/helper.yaml", name="helper", model="child:any", tools=["touch"])
    project.extra["agentDefinitions"] = {"helper": "agents/helper.yaml"}
    project.assembly(parent=[start_child("helper"), "started"], child=[calls(call("touch", name="child")), "done"])
    done = project.cli("run", spawner(project, requiresApproval=["touch"]), "-p", "go")
    assert done.returncode == 0, done.stderr
    assert not (project.root / "touched-child").exists(), "the registered child ran touch unasked"
    assert project.header("helper")["state"] == "waiting_for_approval"


def test_inheritance_survives_a_new_process(project: Project) -> None:
    """The child rests; another process messages it; its call is still held under the parent's gates."""
    _touching_child(project)
    project.assembly(parent=[start_child(), "started"], child=["ready"])
    done = project.cli("run", spawner(project, requiresApproval=["touch"]), "-p", "go")
    assert done.returncode == 0, done.stderr
    child = project.header("child")
    assert child["state"] == "waiting"
    project.assembly(child=[calls(call("touch", name="child")), "done"])
    again = project.cli("message", child["instanceId"], "now touch")
    assert not (project.root / "touched-child").exists(), "the resumed child ran touch unasked"
    assert again.returncode == 3, (again.returncode, again.stdout, again.stderr)



def test_a_fork_of_a_child_keeps_its_callers_gates(project: Project) -> None:
    """``fork CHILD`` makes a root of the child's history, but not an ungated one: its call is still held."""
    _touching_child(project)
    project.assembly(parent=[start_child(), "started"], child=["ready"])
    done = project.cli("run", spawner(project, requiresApproval=["touch"]), "-p", "go")
    assert done.returncode == 0, done.stderr
    child = project.header("child")["instanceId"]
    forked = project.cli("fork", child)
    assert forked.returncode == 0, forked.stderr
    fork = forked.stdout.strip()
    project.assembly(child=[calls(call("touch", name="child")), "done"])
    again = project.cli("message", fork, "now touch")
    assert again.returncode == 3, (again.returncode, again.stdout, again.stderr)
    assert not (project.root / "touched-child").exists(), "the fork of the child ran touch unasked"
    held = json.loads((project.root / "store" / fork / "instance.json").read_text())
    assert [p["tool"] for p in held["pendingApprovals"]] == ["touch"]

@pytest.mark.parametrize("tamper", ["malformed", "removed"])
def test_tampered_inherited_gates_fail_closed(project: Project, tamper: str) -> None:
    """A malformed or missing inheritedGates entry refuses to run the child, naming it; nothing runs."""
    _touching_child(project)
    project.assembly(parent=[start_child(), "started"], child=["ready"])
    done = project.cli("run", spawner(project, requiresApproval=["touch"]), "-p", "go")
    assert done.returncode == 0, done.stderr
    child = project.header("child")
    header_file = project.root / "store" / child["instanceId"] / "instance.json"
    if tamper == "removed":
        del child["inheritedGates"]
        child["definition"]["requiresApproval"] = []
    else:
        child["inheritedGates"] = {"requiresApproval": "touch"}
    header_file.write_text(json.dumps(child))
    project.assembly(child=[calls(call("touch", name="child")), "done"])
    again = project.cli("message", child["instanceId"], "now touch")
    assert not (project.root / "touched-child").exists()
    assert again.returncode != 0
    assert child["instanceId"] in again.stderr
    assert "inheritedGates" in again.stderr
