#!/usr/bin/env bash
# Install loopwright with plain pip, as a user without uv would, and run an agent with it.
#
# 1. Wheels: `uv build --all-packages` builds every distribution of the workspace into a
#    temporary folder; a fresh `python3 -m venv` then gets the `loopwright` meta-package with
#    `pip install --find-links DIST loopwright` (third-party dependencies come from the package
#    index). The quickstart agent runs on the `test` model and its answer is checked.
# 2. A clone: `pip install ./ ./core ./plugins/...` into another fresh venv, pip building each
#    folder itself (the meta-package's dependencies are satisfied by the folders named beside it).
#
# Neither venv sees the workspace's .venv. Extra arguments: none.
source "$(dirname "${BASH_SOURCE[0]}")/_bootstrap.sh"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PYTHON="${PYTHON:-python3}"

check_agent() {  # $1: the venv; runs the quickstart agent from a copy of the example
  local venv="$1" out
  rm -rf "$WORK/quickstart"
  cp -r "$ROOT/examples/quickstart" "$WORK/quickstart"
  rm -rf "$WORK/quickstart/.loopwright"
  out="$(cd "$WORK/quickstart" && "$venv/bin/loopwright" run agents/wordsmith.yaml \
    -i text="the quick brown fox" -p "How many words?" --json)"
  "$venv/bin/python" - "$out" <<'PY'
import json, sys
result = json.loads(sys.argv[1])
expected = 'test answer: count_words -> 1; count_letters -> {"total": 1, "a": 1}'
assert result["state"] == "waiting", result
assert result["text"] == expected, result["text"]
print(f"pip install check: {result['instanceId']} {result['state']}: {result['text']}")
PY
}

echo "pip install check: building every distribution ..." >&2
uv build --quiet --all-packages --wheel -o "$WORK/dist" >&2
ls "$WORK/dist" >&2

echo "pip install check: pip install --find-links DIST loopwright, in a fresh venv ..." >&2
"$PYTHON" -m venv "$WORK/venv-wheels"
"$WORK/venv-wheels/bin/python" -m pip install --quiet --find-links "$WORK/dist" loopwright
"$WORK/venv-wheels/bin/python" -m pip show loopwright loopwright-core | grep -E '^(Name|Version|Location)' >&2
# The wheels went into the venv, not an editable link back to the clone.
"$WORK/venv-wheels/bin/python" -c 'import loopwright, sys; assert sys.prefix in loopwright.__file__, loopwright.__file__'
check_agent "$WORK/venv-wheels"

echo "pip install check: pip install ./ ./core ./plugins/..., in a fresh venv ..." >&2
"$PYTHON" -m venv "$WORK/venv-clone"
(cd "$ROOT" && "$WORK/venv-clone/bin/python" -m pip install --quiet \
  ./ ./core ./plugins/anthropic ./plugins/openai ./plugins/os ./plugins/testing)
check_agent "$WORK/venv-clone"
