"""What a new user reads first says what happens (issue 10, item 8): the quickstart answer, the gaps listed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_quotes_the_answer_the_quickstart_gives(tmp_path: Path) -> None:
    """The README explains the offline test model by its answer; that answer is the one the CLI prints."""
    readme = (ROOT / "README.md").read_text()
    assert "offline test model" in readme
    quoted = re.search(r"its answer is always `(test answer: [^`]+)`", readme.replace("\n", " "))
    assert quoted is not None, "the README no longer quotes the quickstart's answer"
    project = shutil.copytree(ROOT / "examples" / "quickstart", tmp_path / "quickstart")
    # The arguments of scripts/quickstart.sh, which the README's set-up runs.
    done = subprocess.run([sys.executable, "-m", "loopwright.cli", "run", "agents/wordsmith.yaml",
                           "-i", "text=the quick brown fox jumps over the lazy dog",
                           "-p", "How many words are in the text, and how many letters?"],
                          cwd=project, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == quoted.group(1)


def test_concepts_do_not_list_built_features_as_missing() -> None:
    """The "Not built yet" table of concepts.md names none of the commands the CLI has (``worker`` was listed)."""
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    gaps = concepts.split("## Not built yet", 1)[1].split("\n## ", 1)[0]
    listed = {m.strip("` ") for m in re.findall(r"^\| ([^|]+) \|", gaps, re.MULTILINE)} - {"feature", "---"}
    from loopwright.cli import cli  # noqa: PLC0415 - the command names, read when the test runs

    assert listed, "the table is empty or its format changed"
    assert not {name for name in listed if name.split()[0].strip("`") in cli.commands}, listed


def _documented_instance_files() -> dict[str, str]:
    """The files concepts.md lists in a file-store instance's folder: name -> what it says of it."""
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    block = concepts.split("keeps one\nfolder per instance:", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    listed = {m.group(1): m.group(2) for m in re.finditer(r"^ {4}(\S+)\s+(.*)$", block, re.MULTILINE)}
    assert listed, "the instance folder listing in concepts.md is gone or its format changed"
    return listed


def test_the_files_the_docs_list_in_an_instance_folder_are_those_that_appear(tmp_path: Path) -> None:
    """concepts.md lists an instance folder's files (it listed a ``lock`` file that never appeared).

    A run, then a message, leave exactly the files listed without a condition, plus the mailbox
    (created by the first post); every file that appears is listed.
    """
    listed = _documented_instance_files()
    conditional = {name for name, text in listed.items() if "(created by" in text or "(only" in text}
    (tmp_path / "loopwright.yaml").write_text("store: {kind: file, path: ./store}\ndefaultModel: test:any\n")
    (tmp_path / "a.yaml").write_text("name: a\nsystemPrompt: You answer.\n")
    cli = [sys.executable, "-m", "loopwright.cli"]
    done = subprocess.run([*cli, "run", "a.yaml", "-p", "hello"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (folder,) = [p for p in (tmp_path / "store").iterdir() if p.is_dir()]
    assert {p.name for p in folder.iterdir()} == set(listed) - conditional
    done = subprocess.run([*cli, "message", folder.name, "again"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    appeared = {p.name for p in folder.iterdir()}
    assert appeared <= set(listed), appeared - set(listed)
    assert set(listed) - conditional | {"posts.jsonl"} <= appeared
