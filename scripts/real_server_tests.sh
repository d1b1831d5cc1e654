#!/usr/bin/env bash
# Run the OpenAI provider's tests against a real OpenAI-compatible server (llama.cpp through
# llama-cpp-python, with SmolLM2-135M-Instruct): plugins/openai/tests/test_real_server.py.
# On demand, not in the CI run (see docs/testing.md):
#
#   bash scripts/real_server_tests.sh              # builds the server's venv the first time
#   LOOPWRIGHT_LLAMA_VENV=/tmp/llamavenv bash scripts/real_server_tests.sh -k stream
#
# The server's virtualenv is cached in $LOOPWRIGHT_LLAMA_VENV (default
# ~/.cache/loopwright/llamavenv); the first run compiles llama.cpp (about 5 minutes on 2 cores,
# by plugins/openai/scripts/setup_llama_server.sh), later runs reuse it and take about a minute.
# Extra arguments go to pytest. Unlike the normal suite, a skipped test fails this script: a
# run that skipped because the server could not start has tested nothing.
source "$(dirname "${BASH_SOURCE[0]}")/_bootstrap.sh"

VENV="${LOOPWRIGHT_LLAMA_VENV:-$HOME/.cache/loopwright/llamavenv}"
if ! "$VENV/bin/python" -c "import llama_cpp.server" >/dev/null 2>&1; then
  echo "building the llama.cpp server in $VENV (once) ..." >&2
  mkdir -p "$(dirname "$VENV")"
  bash "$ROOT/plugins/openai/scripts/setup_llama_server.sh" "$VENV" >&2
fi
export LOOPWRIGHT_LLAMA_SERVER_PY="$VENV/bin/python"

report="$(mktemp -t loopwright-real-server-XXXXXX.xml)"
trap 'rm -f "$report"' EXIT
status=0
uv run --no-sync pytest -p no:randomly -rs --junitxml="$report" plugins/openai/tests/test_real_server.py "$@" \
  || status=$?
skipped="$(uv run --no-sync python - "$report" <<'PY'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
print(sum(int(s.get("skipped", 0)) for s in root.iter("testsuite")))
PY
)"
if [ "$status" -eq 0 ] && [ "$skipped" != "0" ]; then
  echo "real-server tests: $skipped test(s) skipped; the server did not run (see the reasons above)" >&2
  status=1
fi
exit "$status"
