"""Redaction (issue 29, point 6; seed 002's loop order: recall, redaction, then ``before_inference``).

An assembly's ``redaction:`` cuts API keys and tokens, e-mail addresses, card numbers and its own
patterns from every model request and from what record sinks and ``on_record`` observers get;
the transcript and the store's record log keep what was said. Patterns run on RE2: one it cannot
run in linear time is refused when the assembly loads, at its line and column, and no text
stalls a turn. Driven through a real runtime on a file store, and ``validate`` as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import Harness, call, defn, make_runtime, reply, run_to_rest

import loopwright
from loopwright import hookimpl
from loopwright._config import load_assembly
from loopwright._definition import Redaction, RedactionPattern
from loopwright._redaction import Redactor
from loopwright.errors import ConfigError

pytestmark = pytest.mark.anyio

KEY = "sk-proj-" + "A1b2C3d4" * 5
AWS = "AKIA" + "ABCDEFGHIJKLMNOP"
GITHUB = "ghp_" + "x" * 36
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
CARD = "4111 1111 1111 1111"  # passes the Luhn check
ORDER = "4111 1111 1111 1112"  # the same length, fails it: an order number, kept


def test_each_builtin_set_cuts_what_it_names_and_leaves_the_rest() -> None:
    """Keys, tokens, e-mails and Luhn-valid card numbers become ``[REDACTED:NAME]``; other text stays."""
    r = Redactor(Redaction())
    text = (f"key {KEY}, aws {AWS}, gh {GITHUB}, auth: Bearer abcdefgh12345678, jwt {JWT}, "
            f"mail ada@example.co.uk, card {CARD}, order {ORDER}, plain words")
    assert r.text(text) == (
        "key [REDACTED:apiKey], aws [REDACTED:apiKey], gh [REDACTED:apiKey], auth: [REDACTED:token], "
        "jwt [REDACTED:token], mail [REDACTED:email], card [REDACTED:card], order 4111 1111 1111 1112, plain words")


def test_only_the_sets_asked_for_and_your_own_patterns_apply() -> None:
    """``builtins`` picks the sets; ``patterns`` add names and replacements of their own, after them."""
    r = Redactor(Redaction(builtins=("emails",), patterns=(
        RedactionPattern(name="ticket", pattern=r"TICKET-\d+"),
        RedactionPattern(name="ssn", pattern=r"\b\d{3}-\d{2}-\d{4}\b", replacement="***-**-****"))))
    assert r.text(f"{KEY} bob@example.com TICKET-42 123-45-6789") == (
        f"{KEY} [REDACTED:email] [REDACTED:ticket] ***-**-****")


def test_data_is_redacted_deeply_and_returned_as_is_when_nothing_matched() -> None:
    """Records' data: every string inside mappings and lists; keys stay; no copy when clean."""
    r = Redactor(Redaction())
    clean = {"a": ["x", {"b": 1}]}
    assert r.data(clean) is clean
    assert r.data({"error": [f"bad key {KEY}"], "n": 3}) == {"error": ["bad key [REDACTED:apiKey]"], "n": 3}


def test_a_pattern_that_would_backtrack_runs_in_linear_time() -> None:
    """``(a+)+b`` over 100,000 ``a``s: Python's re runs for ever, RE2 answers at once (pytest-timeout guards)."""
    r = Redactor(Redaction(builtins=(), patterns=(RedactionPattern(name="x", pattern=r"(a+)+b"),)))
    text = "a" * 100_000 + "!"
    assert r.text(text) == text


def test_a_pattern_re2_cannot_run_is_refused_on_load_at_its_position(tmp_path: Path) -> None:
    """A backreference (or a lookaround) would need backtracking: the assembly is refused at the pattern."""
    path = tmp_path / "loopwright.yaml"
    path.write_text("redaction:\n  patterns:\n    - {name: ok, pattern: 'x+'}\n"
                    "    - {name: twice, pattern: '(a)\\1'}\n")
    with pytest.raises(ConfigError) as info:
        load_assembly(path)
    shown = str(info.value)
    assert "loopwright.yaml:4:" in shown
    assert "linear time" in shown


def test_an_unknown_set_is_refused_on_load(tmp_path: Path) -> None:
    """``builtins`` takes only the four sets."""
    path = tmp_path / "loopwright.yaml"
    path.write_text("redaction: {builtins: [apiKeys, passwords]}\n")
    with pytest.raises(ConfigError, match="passwords"):
        load_assembly(path)


def test_an_assembly_built_in_python_is_checked_too() -> None:
    """A Redaction made in Python with a set or a pattern that cannot run fails when the runtime is built."""
    with pytest.raises(ValueError, match="unknown set"):
        Redactor(Redaction(builtins=("nope",)))
    with pytest.raises(ValueError, match=r"patterns\[0\] \(la\)"):
        Redactor(Redaction(patterns=(RedactionPattern(name="la", pattern="(?=x)"),)))


class Seen:
    """A plugin that keeps what ``before_inference`` and ``on_record`` saw."""

    def __init__(self) -> None:
        self.requests: list[list[str | None]] = []
        self.records: list[Any] = []

    @hookimpl
    def loopwright_before_inference(self, request: loopwright.ModelRequest) -> None:
        self.requests.append([m.content for m in request.messages])

    @hookimpl
    def loopwright_on_record(self, record: loopwright.Record) -> None:
        self.records.append(record)


@loopwright.tool
def lookup(email: str) -> str:
    """Fail, naming the address (an error text that reaches the records)."""
    raise loopwright.ToolError(f"no customer {email}; our key is {KEY}")


async def test_the_model_hooks_and_sinks_see_it_redacted_and_the_store_keeps_it(tmp_path: Path) -> None:
    """The request (prompt, tool arguments, tool result) and records out are redacted; the store is not."""
    h = Harness(reply(None, call("lookup", "c", email="ada@example.com")), reply("done"), tools=[lookup])
    seen = Seen()
    rt = make_runtime(tmp_path, h, seen, redaction=Redaction())
    async with rt:
        run, result = await run_to_rest(rt, defn(tools=[lookup]), prompt=f"my key is {KEY}")
        records = await rt.store.read_records(run.instance_id)
        entries = await rt.store.read_entries(run.instance_id)
    assert result.text == "done"
    # What the provider got, both turns: no key, no address.
    sent = json.dumps([[(m.content, [dict(c.arguments) for c in m.tool_calls]) for m in msgs] for msgs in h.sent])
    assert KEY not in sent
    assert "ada@example.com" not in sent
    assert "my key is [REDACTED:apiKey]" in sent
    assert '"email": "[REDACTED:email]"' in sent
    # before_inference runs after redaction (seed 002's order).
    assert f"my key is {KEY}" not in json.dumps(seen.requests)
    assert "my key is [REDACTED:apiKey]" in json.dumps(seen.requests)
    # The observers (and so every sink) got the tool error redacted ...
    errors = [r.data["error"] for r in seen.records if r.kind == "tool_call"]
    assert errors == ["no customer [REDACTED:email]; our key is [REDACTED:apiKey]"]
    # ... while the store keeps what was said and what happened.
    stored = json.dumps(entries)
    assert f"my key is {KEY}" in stored
    assert "ada@example.com" in stored
    assert [r["data"]["error"] for r in records if r["kind"] == "tool_call"] == [
        f"no customer ada@example.com; our key is {KEY}"]


async def test_without_redaction_nothing_changes(tmp_path: Path) -> None:
    """No ``redaction:``: the model gets the prompt as written (redaction is never on by accident)."""
    h = Harness(reply("done"))
    rt = make_runtime(tmp_path, h)
    async with rt:
        await run_to_rest(rt, defn(), prompt=f"my key is {KEY}")
    assert any(m.content == f"my key is {KEY}" for m in h.sent[0])


async def test_model_false_keeps_requests_and_still_redacts_records(tmp_path: Path) -> None:
    """``model: false`` leaves requests alone; ``records`` still cuts what observers get."""
    h = Harness(reply(None, call("lookup", "c", email="ada@example.com")), reply("done"), tools=[lookup])
    seen = Seen()
    rt = make_runtime(tmp_path, h, seen, redaction=Redaction(model=False))
    async with rt:
        await run_to_rest(rt, defn(tools=[lookup]), prompt=f"my key is {KEY}")
    assert any(m.content == f"my key is {KEY}" for m in h.sent[0])
    assert [r.data["error"] for r in seen.records if r.kind == "tool_call"] == [
        "no customer [REDACTED:email]; our key is [REDACTED:apiKey]"]


def test_validate_refuses_a_backtracking_pattern_as_a_subprocess(tmp_path: Path) -> None:
    """``loopwright validate`` names the file, line and column of the pattern and exits 2."""
    (tmp_path / "loopwright.yaml").write_text("redaction:\n  patterns:\n    - name: la\n      pattern: 'a(?!b)'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    done = subprocess.run([sys.executable, "-m", "loopwright.cli", "validate", "loopwright.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "loopwright.yaml:4:16" in done.stdout + done.stderr


def test_the_docs_example_loads_and_does_what_the_page_says(tmp_path: Path) -> None:
    """The ``redaction:`` block of docs/definitions.md is a valid assembly, and its patterns act as shown."""
    page = (Path(__file__).parents[2] / "docs" / "definitions.md").read_text(encoding="utf-8")
    block = page.split("### Redaction", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "loopwright.yaml"
    path.write_text(block)
    assembly = load_assembly(path)
    assert assembly.redaction is not None
    r = Redactor(assembly.redaction)
    assert r.text("TICKET-7 for 123-45-6789 at ada@example.com") == (
        "[REDACTED:ticket] for ***-**-**** at [REDACTED:email]")
