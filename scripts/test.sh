#!/usr/bin/env bash
# Run the whole test suite. Extra arguments go to pytest, e.g.  bash scripts/test.sh -k loop
source "$(dirname "${BASH_SOURCE[0]}")/_bootstrap.sh"
exec uv run --no-sync pytest "$@"
