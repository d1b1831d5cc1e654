"""Attacks with input that costs without bound, or that the runtime cannot read (issue 8, attacks 6 and 8).

A model can write files (definitions it then starts, through ``run_agent_async``) and choose every
argument of every tool call. None of that may freeze, crash or exhaust the runtime:

* **YAML bombs.** A few hundred bytes of aliases stand for billions of values. The loader counts
  what a document expands to (every use of an alias in full), its nesting and its size, and
  refuses it at once with ``file:line:column`` and exit 2, from ``validate``, ``run`` and a child
  started with ``run_agent_async`` (a ToolError the model sees) alike.
* **Tags.** ``!!python/object/apply:os.system`` and every other non-plain tag is a clear error at
  its position, never a bare ``TypeError`` (nor a command that runs).
* **Catastrophic patterns.** ``^(a+)+$`` against 34 characters backtracks for hours in Python's
  :mod:`re`. Output schemas and tool argument schemas match patterns with RE2 (linear time).
* **NaN and infinity.** ``monitor_agent {elapsed: "nan"}`` crashed the runtime. Every duration the
  model sends goes through the one grammar (``loopwright.parse_duration``), and arguments holding
  ``NaN``/``Infinity`` literals (or overflowing ``1e999``) get ``invalid_arguments``.
* **Deep arguments.** Arguments nested 100,000 deep gave a ``RecursionError`` and an instance in
  ``error``. They get ``invalid_arguments``, and the instance goes on.

Each test plays the model with the ``scripted`` provider: through the CLI (a replies file the
test writes) as a subprocess, or through a host script using the Runtime API. Timeouts are hang
guards only; memory is measured inside the subprocess (``ru_maxrss``) under an address-space cap,
so a bomb cannot take the machine with it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "core" / "tests"))

from helpers import Harness, call, defn, make_runtime, reply, result_for, run_to_rest

import loopwright
from loopwright import ToolCall
from loopwright.errors import ConfigError
from loopwright.http import parse_duration as http_parse_duration
from loopwright.http import parse_tool_arguments

#: Seconds before a subprocess counts as hung (a guard only: a bounded loader answers in well under one).
HANG_GUARD = 90
#: The address space a CLI subprocess may use: the bombs reached 2.5 and 3.7 GB.
MEMORY_CAP = 2 * 1024**3
#: The resident memory a refused bomb may have cost the process, in KiB (generous: the CLI alone is ~60 MB).
MAXRSS_KIB = 400 * 1024

#: Runs the CLI with its argv, capped, and reports its peak resident memory on stderr at exit.
_WRAPPER = textwrap.dedent(f"""
    import atexit, resource, runpy, sys

    def peak():
        # This program's own peak (VmHWM): ru_maxrss survives exec on Linux, so it would count
        # the test process this one was forked from.
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

    resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP}, {MEMORY_CAP}))
    atexit.register(lambda: sys.stderr.write("\\nMAXRSS=%d\\n" % peak()))
    sys.argv = ["loopwright", *sys.argv[1:]]
    runpy.run_module("loopwright.cli", run_name="__main__")
""")


def bomb(levels: int = 9) -> str:
    """The billion laughs as YAML: 9 levels of 9 aliases each, about 400 bytes for 9**9 values."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def lw(project: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run ``loopwright ARGS`` in ``project`` under the memory cap; return it and its peak RSS in KiB."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    done = subprocess.run([sys.executable, "-c", _WRAPPER, *args], cwd=project, capture_output=True,
                          text=True, env=env, timeout=HANG_GUARD, check=False)
    rss = [int(line.split("=", 1)[1]) for line in done.stderr.splitlines() if line.startswith("MAXRSS=")]
    assert rss, f"no MAXRSS line (exit {done.returncode}): {done.stderr[-2000:]}"
    return done, rss[-1]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An assembly with the scripted model (replies in model.yaml) and a write root ./work."""
    root = tmp_path / "p"
    (root / "work").mkdir(parents=True)
    (root / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\n"
        "plugins: [testing]\n"
        "providers: {model: {kind: scripted, file: model.yaml}}\n"
        "capabilities: {files: {read: [./work], write: [./work]}, agents: {spawn: true}}\n")
    script(root, ["done"])
    return root


def script(project: Path, replies: list[Any]) -> None:
    """Write what the model answers in the next CLI process (JSON is YAML)."""
    (project / "model.yaml").write_text(json.dumps(replies))


def tool_results(project: Path, instance_id: str) -> dict[str, dict[str, Any]]:
    """The tool results of an instance, by the model's call id, as the file store saved them.

    ``toolCallId`` is the runtime's own id; the model's is saved as ``toolCallWireId`` when it differs.
    """
    # Lines end at \n only (not at U+2028 in an id): split, not splitlines.
    entries = (project / "store" / instance_id / "entries.jsonl").read_text().split("\n")
    messages = [json.loads(line) for line in entries if line.strip()]
    return {m.get("toolCallWireId", m["toolCallId"]): m
            for m in (e.get("m") or {} for e in messages) if m.get("role") == "tool"}


def refused(done: subprocess.CompletedProcess[str], rss: int, file: str, line: int, words: str, *,
            code: int = 2) -> None:
    """Exit ``code`` with ``file:line:column: ... words`` in the output, at a sane memory cost."""
    said = done.stdout + done.stderr
    assert done.returncode == code, (done.returncode, said[-2000:])
    assert f"{file}:{line}:" in said, said[-2000:]
    assert words in said, said[-2000:]
    assert "Traceback" not in said, said[-2000:]
    assert rss < MAXRSS_KIB, f"the refused file cost {rss // 1024} MB"


# -- YAML bombs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["validate", "run"])
def test_alias_bomb_is_refused_at_once_by_validate_and_run(project: Path, command: str) -> None:
    """The 565-byte alias bomb: exit 2 at the alias level that passes the limit, with little memory."""
    (project / "bomb.yaml").write_text("name: bomb\nmodel: model:any\nx:\n" + textwrap.indent(bomb(), "  "))
    done, rss = lw(project, command, "bomb.yaml")
    refused(done, rss, "bomb.yaml", 9, "expands to more than")


def test_alias_bomb_as_a_child_definition_is_a_tool_error(project: Path) -> None:
    """A model writes the bomb into its root and starts it: the call fails, the parent goes on and rests."""
    (project / "work" / "bomb.yaml").write_text("name: bomb\nmodel: model:any\nx:\n" + textwrap.indent(bomb(), "  "))
    (project / "parent.yaml").write_text("name: parent\nmodel: model:any\ntools: [run_agent_async]\n")
    script(project, [
        {"toolCalls": [{"name": "run_agent_async", "id": "c1",
                        "arguments": {"agentSwarmUri": "work/bomb.yaml", "prompt": "go"}}]},
        "gave up",
    ])
    done, rss = lw(project, "run", "parent.yaml", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert rss < MAXRSS_KIB, f"starting the bomb cost {rss // 1024} MB"
    result = json.loads(done.stdout)
    assert result["state"] == "waiting", result  # at rest after its answer
    answer = tool_results(project, result["instanceId"])["c1"]
    assert answer["status"] == "tool_error", answer
    assert "expands to more than" in answer["content"], answer


def test_deep_nesting_is_refused_with_its_position(project: Path) -> None:
    """100,000 nested flow sequences: exit 2 naming where the nesting passes the limit."""
    (project / "deep.yaml").write_text("name: deep\nmodel: model:any\nx: " + "[" * 100_000 + "]" * 100_000 + "\n")
    done, rss = lw(project, "validate", "deep.yaml")
    refused(done, rss, "deep.yaml", 3, "nest more than 64 deep")


def test_huge_file_is_refused_before_it_is_parsed(project: Path) -> None:
    """A definition over the loader's 1 MiB: exit 2 without reading it all."""
    (project / "huge.yaml").write_text("name: huge\nmodel: model:any\nsystemPrompt: " + "a" * (3 * 1024**2) + "\n")
    done, rss = lw(project, "validate", "huge.yaml")
    refused(done, rss, "huge.yaml", 1, "larger than 1,048,576 bytes")


def test_a_bomb_in_a_scripted_reply_file_is_refused(project: Path) -> None:
    """Every YAML reader has the loader's limits: the scripted provider's reply file too."""
    (project / "model.yaml").write_text("replies:\n  - hello\nx:\n" + textwrap.indent(bomb(), "  "))
    (project / "plain.yaml").write_text("name: plain\nmodel: model:any\n")
    done, rss = lw(project, "run", "plain.yaml")
    # The provider is built (reading its reply file) before the instance is created: bad input, exit 2,
    # no instance left behind (issue 10; it used to end an instance in error, exit 1).
    refused(done, rss, "model.yaml", 9, "expands to more than", code=2)


@pytest.mark.parametrize(("name", "text", "words"), [
    ("servers.yaml", "mcpServers: {}\nx:\n" + textwrap.indent(bomb(), "  "), "expands to more than"),
    ("servers.json", '{"mcpServers": {}, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nest more than 64 deep"),
])
def test_mcp_server_files_have_the_loader_limits(tmp_path: Path, name: str, text: str, words: str) -> None:
    """The MCP plugin's server file (YAML or JSON) is read like a definition: a clear error at a position."""
    mcp = pytest.importorskip("loopwright_mcp")
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=words) as caught:
        mcp.load_servers(tmp_path / name)
    assert all(p.line is not None for p in caught.value.problems), caught.value.problems


# -- tags ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["validate", "run"])
def test_python_tags_are_a_clear_error_and_run_nothing(project: Path, command: str) -> None:
    """``!!python/object/apply:os.system``: exit 2 at the tag's position, and the command never ran."""
    marker = project / "PWNED"
    (project / "evil.yaml").write_text(
        "name: evil\nmodel: model:any\n"
        f"systemPrompt: !!python/object/apply:os.system ['touch {marker}']\n")
    done, rss = lw(project, command, "evil.yaml")
    refused(done, rss, "evil.yaml", 3, "unsupported tag !!python/object/apply:os.system")
    assert "TypeError" not in done.stderr
    assert not marker.exists()


def test_custom_tags_on_mappings_are_refused_too(project: Path) -> None:
    """A local tag on a mapping is no more readable than one on a sequence: the same clear error."""
    (project / "tagged.yaml").write_text("name: tagged\nmodel: model:any\nlimits: !thing {turns: 3}\n")
    done, rss = lw(project, "validate", "tagged.yaml")
    refused(done, rss, "tagged.yaml", 3, "unsupported tag !thing")


# -- catastrophic patterns -------------------------------------------------------------------------

EVIL = "^(a+)+$"
#: 34 characters that make a backtracking engine try about 2**34 ways before it fails.
SLOW = "a" * 33 + "!"


def test_catastrophic_pattern_in_an_output_schema_is_matched_in_linear_time(project: Path) -> None:
    """The answer that hung the runtime is checked at once; the model is told, and its next answer passes."""
    output = {"type": "object", "properties": {"word": {"type": "string", "pattern": EVIL}},
              "required": ["word"]}
    (project / "out.yaml").write_text(f"name: out\nmodel: model:any\noutput: {json.dumps(output)}\n")
    script(project, [json.dumps({"word": SLOW}), json.dumps({"word": "aaaa"})])
    done, rss = lw(project, "run", "out.yaml", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["state"] in {"done", "waiting"}, result
    assert json.loads(result["text"]) == {"word": "aaaa"}, result
    assert rss < MAXRSS_KIB


def test_output_pattern_re2_cannot_match_is_a_load_error(project: Path) -> None:
    """A backreference cannot be matched in linear time: ``validate`` names the pattern's line."""
    (project / "back.yaml").write_text(
        "name: back\nmodel: model:any\noutput:\n  type: object\n  properties:\n"
        "    word: {type: string, pattern: '^(a)\\1$'}\n")
    done, rss = lw(project, "validate", "back.yaml")
    refused(done, rss, "back.yaml", 6, "is not RE2 syntax")


_HOST = textwrap.dedent(f"""
    # A host script: a tool whose argument schema has a catastrophic pattern (and one RE2 cannot
    # compile, which is not enforced), and a scripted model that sends the slow string.
    import json, sys
    sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / "core" / "tests")!r})
    from pathlib import Path
    import anyio
    from helpers import Harness, call, defn, make_runtime, reply, result_for, run_to_rest
    from loopwright import Tool

    def echo(word: str, other: str = "") -> str:
        return "got " + word

    schema = {{"type": "object", "required": ["word"], "properties": {{
        "word": {{"type": "string", "pattern": {EVIL!r}}},
        "other": {{"type": "string", "pattern": "^(x)\\\\1$"}}}}}}
    tool = Tool(name="echo", description="echo", function=echo, parameters=schema)

    async def main():
        h = Harness(reply(None, call("echo", "c1", word={SLOW!r})),
                    reply(None, call("echo", "c2", word="aaa", other="yy")), reply("done"), tools=[tool])
        async with make_runtime(Path(sys.argv[1]), h) as rt:
            run, result = await run_to_rest(rt, defn(tools=[tool]), timeout=60)
            tools = [m for m in run.inst.transcript if m.role == "tool"]
            print(json.dumps({{"state": result.state.value,
                               "results": [[m.status.value, m.content] for m in tools]}}))

    anyio.run(main)
""")


def test_catastrophic_pattern_in_a_tool_argument_schema_is_matched_in_linear_time(tmp_path: Path) -> None:
    """A host tool's ``pattern``: the slow argument is invalid_arguments at once; RE2-less ones are not enforced."""
    host = tmp_path / "host.py"
    host.write_text(_HOST)
    done = subprocess.run([sys.executable, str(host), str(tmp_path)], capture_output=True, text=True,
                          timeout=HANG_GUARD, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["state"] == "waiting", out
    (first, text), (second, echoed) = out["results"]
    assert first == "invalid_arguments", out
    assert EVIL in text, out
    assert (second, echoed) == ("success", "got aaa"), out


# -- NaN, infinity and one duration grammar --------------------------------------------------------


def wire_call(name: str, text: str, call_id: str) -> ToolCall:
    """A call whose arguments the model wrote as ``text``, decoded as every provider decodes them."""
    arguments, raw = parse_tool_arguments(text)
    return ToolCall(id=call_id, name=name, arguments=arguments, raw_arguments=raw)


def _child_id(request: Any) -> str:
    """The instance id the last run_agent_async result reported."""
    last = next(m for m in reversed(request.messages) if m.role == "tool")
    return str(json.loads(last.content)["instanceId"])


def _calls_on_child(*make: Callable[[str], ToolCall]) -> Callable[[Any], Any]:
    """A reply that makes calls about the child started in the previous turn."""
    return lambda request: reply(None, *(m(_child_id(request)) for m in make))


async def _parent_and_child(tmp_path: Path, parent: Harness, tools: tuple[str, ...]) -> Any:
    """Run the parent (model ``p:m``) that starts ``child`` (model ``c:m``, answers at once) to rest."""
    child_file = tmp_path / "agents" / "child.yaml"
    child_file.parent.mkdir(parents=True, exist_ok=True)
    child_file.write_text("name: child\nmodel: c:m\n")
    child = Harness(reply("child done"), provider="c")
    async with make_runtime(tmp_path, parent, child, capabilities=loopwright.Capabilities(agents_spawn=True),
                            agent_definitions={"child": str(child_file)}) as rt:
        run, result = await run_to_rest(rt, defn(name="parent", model="p:m", tools=tools), timeout=60)
        with anyio.fail_after(60):
            await rt.wait_idle()
        states = [s["state"] for s in await rt.list_instances()]
    assert result.state.value in {"done", "waiting"}, result  # at rest, not in error
    assert len(states) == 2, states
    assert not {"running", "error"} & set(states), states
    return run


@pytest.mark.anyio
@pytest.mark.parametrize("elapsed", ["nan", "NaN", "inf", "-inf", "1e999", math.nan, math.inf])
async def test_monitor_agent_refuses_non_finite_elapsed(tmp_path: Path, elapsed: Any) -> None:
    """``monitor_agent {elapsed: nan}`` (as a string or a decoded float) is refused; everything rests."""
    parent = Harness(
        reply(None, call("run_agent_async", "start", agentSwarmUri="child", prompt="hi")),
        _calls_on_child(lambda child: call("monitor_agent", "mon", agentId=child, elapsed=elapsed)),
        reply("parent done"), provider="p")
    run = await _parent_and_child(tmp_path, parent, ("run_agent_async", "monitor_agent"))
    answer = result_for(run.inst.transcript, "mon")
    assert answer.status.value in {"tool_error", "invalid_arguments"}, answer


@pytest.mark.anyio
@pytest.mark.parametrize("raw", ['{"timeout": NaN}', '{"timeout": Infinity}', '{"timeout": -Infinity}',
                                 '{"timeout": 1e999}', '{"timeout": "nan"}', '{"timeout": "inf"}'])
async def test_await_monitor_refuses_non_finite_timeout(tmp_path: Path, raw: str) -> None:
    """``await_monitor`` with NaN/Infinity literals or strings: invalid_arguments or a refusal, never a crash."""
    parent = Harness(
        reply(None, call("run_agent_async", "start", agentSwarmUri="child", prompt="hi")),
        _calls_on_child(lambda child: call("monitor_agent", "mon", agentId=child, onFinish=True)),
        lambda _request: reply(None, wire_call("await_monitor", raw, "wait")),
        reply("parent done"), provider="p")
    run = await _parent_and_child(tmp_path, parent, ("run_agent_async", "monitor_agent", "await_monitor"))
    answer = result_for(run.inst.transcript, "wait")
    assert answer.status.value in {"tool_error", "invalid_arguments"}, answer


@pytest.mark.anyio
@pytest.mark.parametrize("context_at", ["nan", "infk", "1e999", math.nan, math.inf])
async def test_monitor_agent_refuses_non_finite_context_at(tmp_path: Path, context_at: Any) -> None:
    """``contextAt`` is a number the model sends too: NaN and infinity are a refusal, not a crash."""
    parent = Harness(
        reply(None, call("run_agent_async", "start", agentSwarmUri="child", prompt="hi")),
        _calls_on_child(lambda child: call("monitor_agent", "mon", agentId=child, contextAt=context_at)),
        reply("parent done"), provider="p")
    run = await _parent_and_child(tmp_path, parent, ("run_agent_async", "monitor_agent"))
    answer = result_for(run.inst.transcript, "mon")
    assert answer.status.value in {"tool_error", "invalid_arguments"}, answer


def test_nan_literals_in_arguments_from_the_cli_are_invalid_arguments(project: Path) -> None:
    """Through the wire decoding every provider shares: ``NaN`` in the JSON text is invalid_arguments."""
    (project / "todo.yaml").write_text("name: todo\nmodel: model:any\ntools: [todowrite]\n")
    script(project, [
        {"toolCalls": [{"name": "todowrite", "id": "c1", "arguments": '{"todos": [], "x": NaN}'}]},
        {"toolCalls": [{"name": "todowrite", "id": "c2", "arguments": {"todos": [{"n": float("inf")}]}}]},
        "done",
    ])
    done, _ = lw(project, "run", "todo.yaml", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    tools = tool_results(project, result["instanceId"])
    assert tools["c1"]["status"] == "invalid_arguments", tools
    assert tools["c2"]["status"] == "invalid_arguments", tools
    assert result["state"] == "waiting", result


PARITY = ["0", "1", "1.5", ".5", "5.", " 7 ", "500ms", "30s", "2m", "1.5h", "1m30s", " 2h 5m ", 3, 0.25, 0,
          "nan", "NaN", "inf", "-inf", "Infinity", "1e3", "1e999", "9" * 400, "-1", "-1s", "5 days", "soon", "",
          "1m30", "ms", True, False, None, math.nan, math.inf, -math.inf, -1, 10**400, [], {}]


@pytest.mark.parametrize("value", PARITY, ids=lambda v: repr(v)[:24])
def test_one_duration_grammar_for_definitions_and_provider_options(value: Any) -> None:
    """``loopwright.parse_duration``, the loader's and ``http.parse_duration`` accept and refuse the same values."""
    from loopwright._config import parse_duration as config_parse_duration  # noqa: PLC0415

    try:
        expected: float | None = loopwright.parse_duration(value)
    except ValueError:
        expected = None
    assert expected is None or math.isfinite(expected)
    assert http_parse_duration(value) == expected
    try:
        assert config_parse_duration(value) == expected
    except ValueError:
        assert expected is None


def test_non_finite_limits_in_a_definition_are_exit_2(project: Path) -> None:
    """``limits.elapsed: .inf`` passes the schema's number type but not the duration grammar."""
    (project / "inf.yaml").write_text("name: inf\nmodel: model:any\nlimits: {elapsed: .inf}\n")
    done, rss = lw(project, "validate", "inf.yaml")
    refused(done, rss, "inf.yaml", 3, "finite")


# -- deep arguments --------------------------------------------------------------------------------

DEEP = 100_000


@pytest.mark.anyio
async def test_arguments_nested_100000_deep_are_invalid_arguments_and_the_instance_goes_on(tmp_path: Path) -> None:
    """As text and as decoded data: invalid_arguments, the next turn runs, the transcript reads back."""
    nested: dict[str, Any] = {}
    inner = nested
    for _ in range(DEEP):
        inner["a"] = {}
        inner = inner["a"]
    h = Harness(
        lambda _request: reply(None, wire_call("todowrite", '{"todos": ' + "[" * DEEP + "]" * DEEP + "}", "text")),
        reply(None, ToolCall(id="data", name="todowrite", arguments={"todos": [], "x": nested})),
        reply(None, call("todowrite", "fine", todos=[])),
        reply("still here"),
    )
    async with make_runtime(tmp_path, h) as rt:
        run, result = await run_to_rest(rt, defn(tools=("todowrite",)), timeout=60)
        assert result.state.value == "waiting", result  # at rest after its answer, not in error
        assert result.text == "still here"
        statuses = {m.provider_call_id: m.status.value for m in run.inst.transcript if m.role == "tool"}
        assert statuses == {"text": "invalid_arguments", "data": "invalid_arguments", "fine": "success"}
        instance_id = run.instance_id
    async with make_runtime(tmp_path, Harness(reply("again"))) as rt:  # a later re-read of the saved transcript
        run = await rt.get_agent(instance_id)
        assert [m.role for m in run.inst.transcript].count("tool") == 3


# -- fuzzing: every input ends in a defined outcome ---------------------------------------------

#: Characters YAML gives meaning to, so that generated text reaches anchors, aliases, tags and nesting.
_YAML_ALPHABET = st.sampled_from([*"abc019 :-[]{},&*!|>'\"#%@`\n\t.", "&a ", "*a", "!!python/", "<<: ", "\\"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_YAML_ALPHABET, max_size=200).map("".join))
def test_fuzz_yaml_reader_gives_data_or_a_positioned_config_error(text: str) -> None:
    """Any text: plain data, or a ConfigError whose problems have a position. Never another exception."""
    import tempfile  # noqa: PLC0415 - hypothesis cannot use the function-scoped tmp_path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "f.yaml"
        path.write_text(text, encoding="utf-8")
        problems = None
        try:
            data = loopwright.read_yaml(path)
        except ConfigError as exc:
            problems = exc.problems
        if problems is None:
            json.dumps(data, default=str)  # plain data: writable without recursion
        else:
            assert problems
            assert all(p.line is not None for p in problems), problems


_JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5))
_JSON_VALUES = st.recursive(_JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_JSON_VALUES.map(lambda v: json.dumps({"v": v})),  # NaN and inf become NaN/Infinity literals
                 st.integers(60, 3000).map(lambda n: '{"v": ' + "[" * n + "]" * n + "}"),
                 st.text(alphabet='{}[]":,0123456789NaInfity.e- ', max_size=60)))
def test_fuzz_tool_arguments_are_plain_json_or_raw(text: str) -> None:
    """Whatever the model writes: a JSON object the loop can save and re-read, or raw text for invalid_arguments."""
    from loopwright._arguments import argument_problem  # noqa: PLC0415 - the rule the loop applies

    arguments, raw = parse_tool_arguments(text)
    assert isinstance(arguments, dict)
    if raw is None:
        assert argument_problem(arguments) is None
        json.loads(json.dumps(arguments, allow_nan=False))
    else:
        assert arguments == {}


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(), st.integers(), st.booleans(), st.none(),
                 st.text(alphabet="0123456789.msh naifNI-+e", max_size=12)))
def test_fuzz_durations_are_finite_or_refused_alike(value: Any) -> None:
    """Every value: a finite, non-negative number of seconds from both entry points, or refused by both."""
    try:
        seconds: float | None = loopwright.parse_duration(value)
    except ValueError:
        seconds = None
    assert seconds is None or (math.isfinite(seconds) and seconds >= 0)
    assert http_parse_duration(value) == seconds
