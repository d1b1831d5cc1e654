"""A newcomer's first day (issue 31, points 2 and 3): a mistyped store path, a run that fails before its first turn.

Every test drives the CLI as a subprocess, as a newcomer would. A store whose folder does not
exist is refused at the assembly's ``store.path`` by ``validate``, ``run``, ``ls`` and ``show``
(exit 2, nothing created) unless the assembly says ``createParents: true``; ``ls`` names the
store it looked in. A run whose first model call fails (a refused connection, a 404) exits 1,
names where the request went, and says that the instance is kept in ``error`` and how to retry it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def lw(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m loopwright.cli ARGS`` in ``cwd``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_")}
    return subprocess.run([sys.executable, "-m", "loopwright.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def tree(folder: Path) -> list[str]:
    """Return every path under ``folder``, relative and sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder with one definition, ``agent.yaml``, and no assembly yet."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "agent.yaml").write_text("name: a\n", encoding="utf-8")
    return folder


# ---------------------------------------------------------------------------------------------
# point 2: store paths
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "name"), [("file", "instances"), ("sqlite", "x.db")])
def test_a_store_in_a_missing_folder_is_refused_at_its_path_and_nothing_is_created(
        project: Path, tmp_path: Path, kind: str, name: str) -> None:
    """``path: /no/such/dir/x.db`` made the folder silently; now every command refuses it at ``store.path``.

    ``validate`` (which builds the store from its options), ``run``, and the read-only ``ls`` and
    ``show`` (which read a built-in store without a runtime) exit 2 with the assembly's line and
    column, and nothing appears on disk.
    """
    missing = tmp_path / "no" / "such" / "dir"
    (project / "loopwright.yaml").write_text(f"defaultModel: test:any\nstore:\n  kind: {kind}\n"
                                             f"  path: {missing / name}\n", encoding="utf-8")
    said = re.compile(rf"loopwright\.yaml:4:9: the folder {re.escape(str(missing))} does not exist: .*"
                      rf"createParents: true.*@ \$\.store\.path")
    for args in (("validate", "loopwright.yaml"), ("run", "agent.yaml", "-p", "hi"), ("ls",),
                 ("show", "20260101-000000-00000000"), ("--json", "ls")):
        out = lw(project, *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert said.search(out.stdout + out.stderr), (args, out.stdout, out.stderr)
    assert not (tmp_path / "no").exists()
    assert tree(project) == ["agent.yaml", "loopwright.yaml"]


@pytest.mark.parametrize(("kind", "name"), [("file", "instances"), ("sqlite", "x.db")])
def test_create_parents_makes_the_missing_folders(project: Path, kind: str, name: str) -> None:
    """``createParents: true`` asks for the folders: the first instance creates them."""
    (project / "loopwright.yaml").write_text(
        f"defaultModel: test:any\nstore: {{kind: {kind}, path: ./state/deep/{name}, createParents: true}}\n",
        encoding="utf-8")
    assert lw(project, "validate", "loopwright.yaml").returncode == 0
    out = lw(project, "run", "agent.yaml", "-p", "hi")
    assert out.returncode == 0, out.stderr
    assert (project / "state" / "deep" / name).exists()
    assert len(json.loads(lw(project, "--json", "ls").stdout)) == 1


def test_the_default_store_is_still_created_in_the_runtime_folder(project: Path) -> None:
    """Without ``path`` (or with one in ``.loopwright``) the store is made there, as before."""
    (project / "loopwright.yaml").write_text("defaultModel: test:any\nstore: {kind: sqlite}\n", encoding="utf-8")
    out = lw(project, "run", "agent.yaml", "-p", "hi")
    assert out.returncode == 0, out.stderr
    assert (project / ".loopwright" / "loopwright.db").is_file()


@pytest.mark.parametrize(("store", "where"), [
    ("{kind: file, path: ./stroe}", "the file store at stroe"),
    ("{kind: sqlite, path: ./lw.db}", "the sqlite store at lw.db"),
])
def test_ls_with_no_instances_names_the_store_it_looked_in(project: Path, store: str, where: str) -> None:
    """``no instances`` said nothing of where; a mistyped path (``stroe``) now shows. ``--json`` stays ``[]``."""
    (project / "loopwright.yaml").write_text(f"defaultModel: test:any\nstore: {store}\n", encoding="utf-8")
    place = where  # named relative to the working directory, as every message names a file
    out = lw(project, "ls")
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == f"no instances in {place} (nothing is there yet)"
    assert out.stdout == ""
    out = lw(project, "ls", "--state", "error")
    assert out.stderr.strip() == f"no instances in state 'error' in {place} (nothing is there yet)"
    out = lw(project, "ls", "--tree")
    assert out.stderr.strip() == f"no instances in {place} (nothing is there yet)"
    out = lw(project, "--json", "ls")
    assert (out.returncode, json.loads(out.stdout)) == (0, [])


# ---------------------------------------------------------------------------------------------
# point 3: a run that fails before its first turn
# ---------------------------------------------------------------------------------------------


class _NotFound(BaseHTTPRequestHandler):
    """Answers every request 404 with an OpenAI-style error body."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"error": {"message": "The model `gpt-nope` does not exist",
                                     "type": "invalid_request_error", "code": "model_not_found"}}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        """Keep the test's output quiet."""


@pytest.fixture
def not_found_server() -> Iterator[str]:
    """An HTTP server on loopback that answers 404 to everything; its base URL (``.../v1``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("failure", ["refused", "404"])
def test_a_run_that_fails_before_its_first_turn_says_where_and_what_is_left(
        project: Path, not_found_server: str, failure: str) -> None:
    """A refused connection or a 404 model: exit 1, the URL named, the kept instance and how to retry it."""
    base = "http://127.0.0.1:9/v1" if failure == "refused" else not_found_server
    (project / "loopwright.yaml").write_text(
        "store: {kind: file, path: ./store}\n"
        f"providers:\n  local:\n    kind: openai\n    baseUrl: {base}\n    apiKey: x\n    maxRetries: 0\n"
        "defaultModel: local:gpt-nope\n", encoding="utf-8")
    out = lw(project, "run", "agent.yaml", "-p", "hi")
    assert out.returncode == 1, out.stdout + out.stderr
    (kept,) = json.loads(lw(project, "--json", "ls").stdout)
    iid = kept["instanceId"]
    assert kept["state"] == "error"
    assert f"(request: POST {base}/chat/completions)" in out.stderr, out.stderr
    assert ("Connection refused" if failure == "refused" else "(HTTP 404): The model `gpt-nope` does not exist") \
        in out.stderr, out.stderr
    assert f"the instance {iid} is saved in the error state, with its prompt and no turn" in out.stderr, out.stderr
    assert f"retry it with 'loopwright message {iid} TEXT'" in out.stderr, out.stderr
    # --json: the result on stdout, the same exit code; show names the URL too.
    out = lw(project, "--json", "run", "agent.yaml", "-p", "hi")
    assert out.returncode == 1
    assert json.loads(out.stdout)["error"].endswith(f"(request: POST {base}/chat/completions)")
    assert f"{base}/chat/completions" in lw(project, "show", iid).stdout


# ---------------------------------------------------------------------------------------------
# point 6: one form of path in error messages
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["agents/a.yaml", "./agents/a.yaml", "agents/../agents/a.yaml", "ABSOLUTE"])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_every_error_names_a_file_the_same_way_however_it_was_given(
        project: Path, given: str, command: str) -> None:
    """A definition's problem, a YAML error and a store refusal each name the file one way.

    Before, ``validate agents/a.yaml`` named the definition by its absolute path, a YAML error by
    the path as typed (``./agents/b.yaml`` or ``/abs/...``), and the store refusal by the absolute
    folder. Now a file beneath the working directory is always named relative to it, whether it
    was given relative, with ``./``, with ``..`` or absolute.
    """
    (project / "agents").mkdir()
    (project / "agents" / "a.yaml").write_text("name: a\nmodel: test:any\ntools: [nope]\n", encoding="utf-8")
    (project / "agents" / "b.yaml").write_text("name: [\n", encoding="utf-8")
    (project / "loopwright.yaml").write_text("store:\n  kind: sqlite\n  path: data/x.db\n", encoding="utf-8")
    spelled = str(project / "agents" / "a.yaml") if given == "ABSOLUTE" else given
    extra = ["-p", "hi"] if command == "run" else []
    out = lw(project, command, spelled, *extra)
    assert out.returncode == 2, out.stdout + out.stderr
    text = out.stdout + out.stderr
    # The store refusal comes first (the assembly is checked before the definition).
    assert "the folder data does not exist" in text, text
    assert str(project) not in text, text

    (project / "loopwright.yaml").write_text("store:\n  kind: sqlite\n  path: x.db\n", encoding="utf-8")
    out = lw(project, command, spelled, *extra)
    assert out.returncode == 2, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert re.search(r"(?m)^\s*agents/a\.yaml:3:9: definition 'a' names the tool 'nope'", text), text
    assert str(project) not in text, text

    bad = spelled.replace("a.yaml", "b.yaml")
    out = lw(project, command, bad, *extra)
    assert out.returncode == 2, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert "agents/b.yaml:2:1: invalid YAML" in text, text
    assert str(project) not in text, text
    assert "./agents" not in text, text


def test_a_file_outside_the_working_directory_is_named_by_its_absolute_path(project: Path) -> None:
    """From a sub-folder, ``../agents/a.yaml`` is named ``/abs/.../agents/a.yaml``: never ``../`` chains."""
    (project / "agents").mkdir()
    (project / "agents" / "a.yaml").write_text("name: a\nmodel: test:any\ntools: [nope]\n", encoding="utf-8")
    (project / "sub").mkdir()
    out = lw(project / "sub", "validate", "../agents/a.yaml")
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{project / 'agents' / 'a.yaml'}:3:9: definition 'a'" in out.stdout + out.stderr
