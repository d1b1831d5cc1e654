#!/usr/bin/env bash
# Install the example third-party provider package from its own folder into a fresh virtual
# environment, as a third party's user would (non-editable wheels, no workspace), and run its
# tests there. Proves the "write a provider plugin" guide's package stands on its own.
source "$(dirname "${BASH_SOURCE[0]}")/_bootstrap.sh"
VENV="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$VENV")"' EXIT
uv venv --quiet "$VENV"
uv pip install --quiet --python "$VENV/bin/python" ./core ./plugins/testing "./plugins/example-echo[test]"
cd plugins/example-echo
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir . tests
