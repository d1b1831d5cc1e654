#!/usr/bin/env bash
# Run the whole test suite. Extra arguments go to pytest, e.g.  bash scripts/test.sh -k loop
# The postgres store's tests get a throwaway PostgreSQL server (scripts/postgres.sh) when the
# server binaries are installed; without them those tests skip.
source "$(dirname "${BASH_SOURCE[0]}")/_bootstrap.sh"
source "$ROOT/scripts/postgres.sh"
loopwright_start_postgres
# Not exec: the EXIT trap set above stops the server when pytest is done.
status=0
uv run --no-sync pytest "$@" || status=$?
exit "$status"
