"""Attacks on saved rows (issue 25, point 7): one tampered row must never stop a worker fleet.

The attacker can write the store (a file on disk, the sqlite file, the postgres tables) but not
the assembly. Each test submits good and bad instances with ``loopwright run --detach``, damages
the bad rows in the store the way an attacker would (a definition naming a hook or an unknown
tool, grants widened with the ``capabilitiesRecorded`` marker removed, malformed grants, the
definition removed, a line of the entry log that is not JSON, a header that is not JSON), then
runs a real ``loopwright worker`` subprocess. The attack succeeds if the worker exits, a good
instance never completes, a bad one runs (its model is called) or is taken up again by a second
worker. Every bad row must end ``error`` with a ``quarantined:`` error and a ``quarantined``
record; the good instances beside them are the control (the same flow, intact rows, runs).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PLUGIN = ROOT / "core" / "tests" / "worker_plugin.py"
TIMEOUT = 120  # a hang guard only
GOOD = 3


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    env["LOOPWRIGHT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return {**env, **extra}


def _lw(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


class Rows:
    """The saved rows of one store, as an attacker with write access to it sees them."""

    def __init__(self, store: str, project: Path, dsn: str | None) -> None:
        self.store, self.project, self.dsn = store, project, dsn

    def header(self, iid: str) -> dict[str, Any]:
        if self.store == "file":
            data: dict[str, Any] = json.loads((self.project / "store" / iid / "instance.json").read_text())
            return data
        if self.store == "sqlite":
            with sqlite3.connect(self.project / "lw.db") as conn:
                return dict(json.loads(conn.execute("SELECT header FROM instances WHERE id = ?", (iid,)).fetchone()[0]))
        import psycopg  # noqa: PLC0415 - only the postgres runs need it

        with psycopg.connect(str(self.dsn)) as conn:
            row = conn.execute("SELECT header FROM loopwright.instances WHERE id = %s", (iid,)).fetchone()
            assert row is not None
            return dict(row[0])

    def write_header_text(self, iid: str, text: str) -> None:
        """Replace the saved header with ``text`` (JSON or not)."""
        if self.store == "file":
            (self.project / "store" / iid / "instance.json").write_text(text)
        elif self.store == "sqlite":
            with sqlite3.connect(self.project / "lw.db") as conn:
                conn.execute("UPDATE instances SET header = ? WHERE id = ?", (text, iid))
        else:
            import psycopg  # noqa: PLC0415 - only the postgres runs need it

            with psycopg.connect(str(self.dsn)) as conn:
                conn.execute("UPDATE loopwright.instances SET header = %s::json WHERE id = %s", (text, iid))

    def edit_header(self, iid: str, edit: Callable[[dict[str, Any]], None]) -> None:
        header = self.header(iid)
        edit(header)
        self.write_header_text(iid, json.dumps(header))

    def append_log_text(self, iid: str, lines: list[str]) -> None:
        """Append raw lines to the entry log (file and sqlite: postgres keeps only valid JSON)."""
        if self.store == "file":
            with (self.project / "store" / iid / "entries.jsonl").open("a") as f:
                f.write("".join(f"{line}\n" for line in lines))
        else:
            with sqlite3.connect(self.project / "lw.db") as conn:
                conn.executemany("INSERT INTO entries (instance_id, json) VALUES (?, ?)", [(iid, x) for x in lines])


def _hook(h: dict[str, Any]) -> None:
    h["definition"]["hooks"] = ["evil.py"]


def _unknown_tool(h: dict[str, Any]) -> None:
    h["definition"]["tools"] = ["nap", "rm_rf"]


def _widened_no_marker(h: dict[str, Any]) -> None:
    h["capabilities"]["shell"] = "full"
    h["capabilities"]["files"] = {"read": ["/"], "write": ["/"]}
    del h["capabilitiesRecorded"]


def _malformed_grants(h: dict[str, Any]) -> None:
    h["capabilities"] = "all"


def _no_definition(h: dict[str, Any]) -> None:
    h["definition"] = 42
    del h["definitionPath"]


HEADER_DAMAGE: dict[str, Callable[[dict[str, Any]], None]] = {
    "hook": _hook, "unknownTool": _unknown_tool, "widenedNoMarker": _widened_no_marker,
    "malformedGrants": _malformed_grants, "noDefinition": _no_definition,
}


def _project(tmp_path: Path, store: str, request: pytest.FixtureRequest) -> tuple[Path, dict[str, str], Rows]:
    extra: dict[str, str] = {}
    dsn = None
    if store == "postgres":
        dsn = extra["LOOPWRIGHT_DSN"] = request.getfixturevalue("fresh_database")
        config = "{kind: postgres, dsnEnv: LOOPWRIGHT_DSN}"
    else:
        config = {"file": "{kind: file, path: ./store}", "sqlite": "{kind: sqlite, path: ./lw.db}"}[store]
    shutil.copy(PLUGIN, tmp_path / "worker_plugin.py")
    plugins = "loopwright_postgres, worker_plugin.py" if store == "postgres" else "worker_plugin.py"
    (tmp_path / "loopwright.yaml").write_text(f"store: {config}\nplugins: [{plugins}]\n")
    (tmp_path / "brief.yaml").write_text("name: brief\nmodel: script:brief\ntools: [nap]\n")
    return tmp_path, _env(extra), Rows(store, tmp_path, dsn)


def _submit(project: Path, env: dict[str, str], prompt: str) -> str:
    done = _lw(project, env, "run", "--detach", "--json", "brief.yaml", "-p", prompt)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["instanceId"])


def _shown(project: Path, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    done = _lw(project, env, "ls", "--json")
    assert done.returncode == 0, done.stderr
    return {i["instanceId"]: i for i in json.loads(done.stdout)}


@pytest.mark.parametrize("store", ["file", "sqlite", "postgres"])
def test_tampered_rows_are_quarantined_and_the_worker_serves_the_rest(tmp_path: Path, store: str,
                                                                      request: pytest.FixtureRequest) -> None:
    project, env, rows = _project(tmp_path, store, request)
    good = [_submit(project, env, f"good {n}") for n in range(GOOD)]
    bad: dict[str, str] = {}
    for kind, damage in HEADER_DAMAGE.items():
        iid = _submit(project, env, kind)
        rows.edit_header(iid, damage)
        bad[iid] = kind
    if store != "postgres":  # postgres keeps only valid JSON in its rows
        iid = _submit(project, env, "badLog")
        rows.append_log_text(iid, ["not json {", json.dumps({"type": "message"})])
        bad[iid] = "badLog"
        unreadable = _submit(project, env, "notJson")
        rows.write_header_text(unreadable, '{"instanceId": "broken')
    good.append(_submit(project, env, "good last"))  # queued behind every bad row
    worker = subprocess.Popen([sys.executable, "-m", "loopwright.cli", "worker", "--poll", "50ms", "--json"],
                              cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            shown = _shown(project, env)
            if (all(shown[iid]["state"] == "waiting" for iid in good)
                    and all(shown[iid]["state"] == "error" for iid in bad)):
                break
            assert worker.poll() is None, worker.communicate()  # the attack: the worker died
            assert time.monotonic() < deadline, {iid: shown[iid]["state"] for iid in (*good, *bad)}
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=TIMEOUT)
    assert worker.returncode == 0, err
    assert "Traceback" not in err
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    picked = Counter(e["instanceId"] for e in events if e["event"] == "pickedUp")
    quarantined = Counter(e["instanceId"] for e in events if e["event"] == "quarantined")
    assert picked == Counter(good)  # every good one ran once; no bad one ran
    assert quarantined == Counter(list(bad))  # each bad one quarantined once (never retried)
    shown = _shown(project, env)
    for iid, kind in bad.items():
        assert shown[iid]["usage"].get("requests", 0) == 0, kind  # its model was never called
        assert str(rows.header(iid)["error"]).startswith("quarantined: "), kind
        assert rows.header(iid)["stopReason"] == "error", kind
        assert "queued" not in rows.header(iid), kind
        shown_one = _lw(project, env, "show", iid)
        assert "quarantined:" in shown_one.stdout, (kind, shown_one.stdout)
    assert {shown[iid]["usage"]["requests"] for iid in good} == {1}
    # The widened grants never came into force: the row still says so, and nothing ran under them.
    assert "capabilitiesRecorded" not in rows.header(next(i for i, k in bad.items() if k == "widenedNoMarker"))
    # A second worker takes none of them up again.
    again = _lw(project, env, "worker", "--once", "--poll", "50ms", "--json")
    assert again.returncode == 0, again.stderr
    assert [json.loads(line) for line in again.stdout.splitlines() if line.strip()] == []


def test_the_quarantine_says_why_in_the_records(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    project, env, rows = _project(tmp_path, "file", request)
    iid = _submit(project, env, "hooked")
    rows.edit_header(iid, _hook)
    done = _lw(project, env, "worker", "--once", "--poll", "50ms")
    assert done.returncode == 0, done.stderr
    assert f"quarantined {iid}: its definition cannot run here" in done.stdout
    records = [json.loads(line) for line in (project / "store" / iid / "records.jsonl").read_text().splitlines()]
    why = [r for r in records if r["kind"] == "quarantined"]
    assert len(why) == 1
    assert "evil.py" in why[0]["data"]["reason"]
    assert why[0]["data"]["by"].startswith("loopwright")


def test_resuming_a_tampered_row_by_hand_names_the_instance(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    project, env, rows = _project(tmp_path, "file", request)
    iid = _submit(project, env, "widened")
    rows.edit_header(iid, _widened_no_marker)
    resumed = _lw(project, env, "resume", iid)
    assert resumed.returncode != 0
    assert f"instance {iid}" in resumed.stderr, resumed.stderr
    assert "capabilitiesRecorded" in resumed.stderr, resumed.stderr
    assert rows.header(iid)["state"] == "running"  # the CLI refuses it; only a worker quarantines


# -- point 8: rows that carry grants and gates, signed (integrity.keyEnv) -------------------------------

KEY = "k" * 16 + "-row-integrity-key-for-tests"  # 44 characters
GATED = "name: gated\nmodel: script:gate\ntools: [nap]\nrequiresApproval: [nap]\n"


def _signed_project(tmp_path: Path, store: str, request: pytest.FixtureRequest, *,
                    key: str | None = KEY) -> tuple[Path, dict[str, str], Rows]:
    """A project whose assembly signs rows with ``$LW_ROW_KEY`` (set to ``key``; unset when None)."""
    project, env, rows = _project(tmp_path, store, request)
    assembly = project / "loopwright.yaml"
    assembly.write_text(assembly.read_text() + "agentDefinitions: {gated: gated.yaml}\n"
                        "integrity: {keyEnv: LW_ROW_KEY}\n")
    (project / "gated.yaml").write_text(GATED)
    if key is not None:
        env["LW_ROW_KEY"] = key
    return project, env, rows


def _drop_gate(h: dict[str, Any]) -> None:
    h["definition"].pop("requiresApproval")


def _drop_gate_and_name(h: dict[str, Any]) -> None:
    h.pop("registeredDefinition")
    h["definition"].pop("requiresApproval")


def _widen_with_marker(h: dict[str, Any]) -> None:
    h["capabilities"]["shell"] = "allow"
    h["capabilities"]["files"] = {"read": ["/"], "write": ["/"]}


def _unsigned(h: dict[str, Any]) -> None:
    h.pop("rowSignature")


def _no_grant_keys(h: dict[str, Any]) -> None:
    h.pop("capabilities")
    h.pop("capabilitiesRecorded")


SIGNED_DAMAGE: dict[str, Callable[[dict[str, Any]], None]] = {
    "dropGate": _drop_gate, "dropGateAndName": _drop_gate_and_name, "widenWithMarker": _widen_with_marker,
    "unsigned": _unsigned, "noGrantKeys": _no_grant_keys,
}


def _work(project: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Run one ``loopwright worker --once`` and return its events."""
    done = _lw(project, env, "worker", "--once", "--poll", "50ms", "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("store", ["file", "sqlite", "postgres"])
def test_signed_rows_refuse_a_dropped_gate_widened_grants_and_a_copied_signature(
        tmp_path: Path, store: str, request: pytest.FixtureRequest) -> None:
    """With an integrity key, every tampered row of grants, gates or definition is quarantined; nothing of it runs.

    The attacks: the gate removed from the saved definition (with and without the registered
    name that makes the runtime read the assembly's), grants widened with the marker kept, the
    signature removed, both grant keys removed (the old rule would give the runtime's grants), and
    a signature copied from another row. The good rows beside them are signed and intact, and
    rest held for approval, their gated call not run.
    """
    project, env, rows = _signed_project(tmp_path, store, request)
    good = [_submit(project, env, f"good {n}") for n in range(2)]
    for iid in good:
        assert str(rows.header(iid)["rowSignature"]).startswith("hmac-sha256:v1:"), rows.header(iid)
    bad: dict[str, str] = {}
    for kind, damage in SIGNED_DAMAGE.items():
        done = _lw(project, env, "run", "--detach", "--json", "gated", "-p", kind)
        assert done.returncode == 0, done.stderr
        iid = str(json.loads(done.stdout)["instanceId"])
        assert rows.header(iid)["registeredDefinition"] == "gated"
        rows.edit_header(iid, damage)
        bad[iid] = kind
    other = _submit(project, env, "copied")  # a brief row, with a signature of its own, given to a gated one
    done = _lw(project, env, "run", "--detach", "--json", "gated", "-p", "copy")
    copied = str(json.loads(done.stdout)["instanceId"])
    signature = rows.header(other)["rowSignature"]
    rows.edit_header(copied, lambda h: (_drop_gate_and_name(h), h.update(rowSignature=signature)))
    bad[copied] = "copiedSignature"

    events = _work(project, env)
    quarantined = {e["instanceId"]: e for e in events if e["event"] == "quarantined"}
    assert set(quarantined) == set(bad), (events, bad)
    assert not (project / "gate.ran").exists()  # no gated call ran, in any row
    shown = _shown(project, env)
    for iid, kind in bad.items():
        header = rows.header(iid)
        assert (header["state"], header["stopReason"]) == ("error", "error"), kind
        assert shown[iid]["usage"].get("requests", 0) == 0, kind  # its model was never called
        reason = str(header["error"])
        if kind == "unsigned":
            assert "is not signed" in reason, reason
            assert "LW_ROW_KEY" in reason, reason
        elif kind == "noGrantKeys":
            assert "records no grants" in reason or "does not verify" in reason, reason
        else:
            assert "signature does not verify" in reason, (kind, reason)
    for iid in [*good, other]:
        assert shown[iid]["state"] == "waiting", shown[iid]  # brief rows rest at once, intact


def test_without_a_key_a_registered_definition_is_read_from_the_assembly_not_the_row(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """No integrity key: removing the gate from a registered definition's snapshot drops nothing.

    The row names its registered definition; the runtime reads that from the assembly whenever it
    loads the instance, so the gate holds the call. (Removing the name as well is what only a
    key refuses: the next test shows it, and docs/security.md states the limit.)
    """
    project, env, rows = _project(tmp_path, "file", request)
    assembly = project / "loopwright.yaml"
    assembly.write_text(assembly.read_text() + "agentDefinitions: {gated: gated.yaml}\n")
    (project / "gated.yaml").write_text(GATED)
    done = _lw(project, env, "run", "--detach", "--json", "gated", "-p", "go")
    assert done.returncode == 0, done.stderr
    iid = str(json.loads(done.stdout)["instanceId"])
    header = rows.header(iid)
    assert header["registeredDefinition"] == "gated"
    assert "rowSignature" not in header  # no key: rows are not signed
    rows.edit_header(iid, _drop_gate)
    events = _work(project, env)
    assert [e["event"] for e in events if e["instanceId"] == iid][:1] == ["pickedUp"], events
    assert rows.header(iid)["state"] == "waiting_for_approval"
    assert not (project / "gate.ran").exists()
    # The assembly no longer registers it: the row fails closed (its snapshot is never a fallback).
    assembly.write_text(assembly.read_text().replace("agentDefinitions: {gated: gated.yaml}\n",
                                                     "agentDefinitions: {}\n"))
    refused = _lw(project, env, "approve", iid)
    assert refused.returncode != 0
    assert "registered definition 'gated'" in refused.stderr, refused.stderr
    assert iid in refused.stderr, refused.stderr
    assert not (project / "gate.ran").exists()


def test_without_a_key_the_row_is_trusted_as_saved(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The documented limit, shown: without a key, a row whose gate and registered name are removed runs ungated.

    With the key (the test above), the same row is quarantined.
    """
    project, env, rows = _project(tmp_path, "file", request)
    (project / "gated.yaml").write_text(GATED)
    done = _lw(project, env, "run", "--detach", "--json", "gated.yaml", "-p", "go")
    assert done.returncode == 0, done.stderr
    iid = str(json.loads(done.stdout)["instanceId"])
    rows.edit_header(iid, _drop_gate)
    _work(project, env)
    assert (project / "gate.ran").exists()  # the limit: whoever writes the store dropped the gate


def test_rows_saved_before_the_key_or_with_another_key_fail_closed(tmp_path: Path,
                                                                  request: pytest.FixtureRequest) -> None:
    """Setting a key refuses the rows saved without one; a process with another key refuses the rows of the first."""
    project, env, rows = _project(tmp_path, "file", request)
    (project / "gated.yaml").write_text(GATED)
    before = _submit(project, env, "before the key")
    assembly = project / "loopwright.yaml"
    assembly.write_text(assembly.read_text() + "integrity: {keyEnv: LW_ROW_KEY}\n")
    signed = _submit(project, {**env, "LW_ROW_KEY": KEY}, "signed")
    other_key = {**env, "LW_ROW_KEY": "x" * 40}
    resumed = _lw(project, other_key, "resume", signed)
    assert resumed.returncode != 0
    assert f"instance {signed}" in resumed.stderr, resumed.stderr
    assert "another key than LW_ROW_KEY" in resumed.stderr, resumed.stderr
    assert KEY not in resumed.stderr + resumed.stdout
    assert "x" * 40 not in resumed.stderr
    events = _work(project, {**env, "LW_ROW_KEY": KEY})
    assert [(e["instanceId"], e["event"]) for e in events if e["event"] in {"quarantined", "pickedUp"}] == [
        (before, "quarantined"), (signed, "pickedUp")], events
    assert "is not signed" in str(rows.header(before)["error"])
    assert rows.header(signed)["state"] == "waiting"


@pytest.mark.parametrize(("key", "said"), [(None, "is not set"), ("short", "holds 5 characters")])
def test_a_missing_or_short_key_is_a_config_error_at_its_line(tmp_path: Path, request: pytest.FixtureRequest,
                                                              key: str | None, said: str) -> None:
    """Exit 2, the assembly's file, line and column named, the key's value never; nothing is created."""
    project, env, _rows = _signed_project(tmp_path, "file", request, key=key)
    done = _lw(project, env, "run", "--detach", "--json", "gated", "-p", "go")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert said in done.stderr, done.stderr
    assert "LW_ROW_KEY" in done.stderr, done.stderr
    assert "loopwright.yaml:4:" in done.stderr, done.stderr  # the line of integrity.keyEnv
    assert not (project / "store").exists() or list((project / "store").iterdir()) == []
