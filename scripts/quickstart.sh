#!/usr/bin/env bash
# Run the quickstart agent offline (test provider, embedded file store). Extra arguments go to
# `loopwright run`, e.g.  bash scripts/quickstart.sh --json
source "$(dirname "${BASH_SOURCE[0]}")/_bootstrap.sh"
cd "$ROOT/examples/quickstart"
exec uv run --no-sync loopwright run agents/wordsmith.yaml \
  -i text="the quick brown fox jumps over the lazy dog" \
  -p "How many words are in the text, and how many letters?" "$@"
