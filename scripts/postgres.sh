#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests of the `postgres` store.
#
# Sourced by scripts/test.sh:  source scripts/postgres.sh && loopwright_start_postgres
# or run on its own around one command:  bash scripts/postgres.sh .venv/bin/pytest plugins/postgres
#
# When LOOPWRIGHT_TEST_POSTGRES_DSN is already set, it is used as it is and nothing is started.
# Otherwise, if the PostgreSQL server binaries are found (on PATH, or the newest
# /usr/lib/postgresql/*/bin), it runs initdb into a new temporary folder, starts a server that
# listens only on a unix socket in that folder (no TCP port, so no port clash), with trust auth and
# fsync off, creates the database `loopwright_test`, and exports LOOPWRIGHT_TEST_POSTGRES_DSN.
# The server is stopped and its folder removed when the shell exits (trap EXIT). As root, initdb
# and pg_ctl run as the `postgres` user (initdb refuses to run as root).
#
# Without the binaries it only says so: the tests that need the server skip, unless
# LOOPWRIGHT_REQUIRE_POSTGRES=1 (set by .ci/run), which makes them fail instead.

_lw_pg_bindir() {
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    # /usr/local/bin may hold symlinks to only some of them: use the folder they point into.
    dirname "$(readlink -f "$(command -v pg_ctl)")"
    return 0
  fi
  local dir
  dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/createdb" ]; then
    echo "$dir"
    return 0
  fi
  return 1
}

# Run a server binary as the `postgres` user when we are root, directly otherwise.
_lw_pg_as_owner() {
  if [ "$(id -u)" = 0 ]; then
    (cd "$_LW_PG_DIR" && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

_lw_pg_stop() {
  if [ -n "${_LW_PG_DIR:-}" ] && [ -d "$_LW_PG_DIR" ]; then
    if [ -f "$_LW_PG_DIR/data/postmaster.pid" ]; then
      _lw_pg_as_owner "$_LW_PG_BIN/pg_ctl" -D "$_LW_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$_LW_PG_DIR"
  fi
  _LW_PG_DIR=""
}

loopwright_start_postgres() {
  if [ -n "${LOOPWRIGHT_TEST_POSTGRES_DSN:-}" ]; then
    echo "postgres: using LOOPWRIGHT_TEST_POSTGRES_DSN from the environment" >&2
    return 0
  fi
  if ! _LW_PG_BIN="$(_lw_pg_bindir)"; then
    echo "postgres: no PostgreSQL server binaries (initdb, pg_ctl) found; the postgres store's tests will skip" >&2
    return 0
  fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    echo "postgres: running as root but there is no 'postgres' user to run the server as; tests will skip" >&2
    return 0
  fi
  _LW_PG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/lwpg.XXXXXX")"
  trap _lw_pg_stop EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  if [ "$(id -u)" = 0 ]; then
    chown postgres "$_LW_PG_DIR"
  fi
  local port=5432
  if ! _lw_pg_as_owner "$_LW_PG_BIN/initdb" -D "$_LW_PG_DIR/data" -U postgres --auth=trust --no-sync \
      -E UTF8 --locale=C >"$_LW_PG_DIR/initdb.log" 2>&1; then
    echo "postgres: initdb failed:" >&2
    cat "$_LW_PG_DIR/initdb.log" >&2
    _lw_pg_stop
    return 1
  fi
  if ! _lw_pg_as_owner "$_LW_PG_BIN/pg_ctl" -D "$_LW_PG_DIR/data" -l "$_LW_PG_DIR/server.log" -w -t 30 \
      -o "-k $_LW_PG_DIR -c listen_addresses='' -p $port -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
      start >/dev/null; then
    echo "postgres: the server did not start:" >&2
    cat "$_LW_PG_DIR/server.log" >&2
    _lw_pg_stop
    return 1
  fi
  if ! _lw_pg_as_owner "$_LW_PG_BIN/createdb" -h "$_LW_PG_DIR" -p "$port" -U postgres loopwright_test; then
    echo "postgres: createdb failed" >&2
    _lw_pg_stop
    return 1
  fi
  export LOOPWRIGHT_TEST_POSTGRES_DSN="host=$_LW_PG_DIR port=$port user=postgres dbname=loopwright_test"
  echo "postgres: throwaway server on $_LW_PG_DIR (LOOPWRIGHT_TEST_POSTGRES_DSN is set)" >&2
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  # Run on its own: start the server, run the command given, then stop the server.
  set -euo pipefail
  loopwright_start_postgres
  if [ "$#" -gt 0 ]; then
    status=0
    "$@" || status=$?
    exit "$status"
  fi
  echo "usage: bash scripts/postgres.sh COMMAND [ARGS...]  (runs COMMAND with LOOPWRIGHT_TEST_POSTGRES_DSN set)" >&2
  exit 2
fi
