#!/usr/bin/env bash
# On-demand mutation pass (docs/testing.md, "Mutation score"); not run in CI.
#   scripts/mutation.sh MODULE TEST_FILE... 
#   SAMPLE=N SEED=S scripts/mutation.sh ...   # run a seeded random N of the non-annotation mutants
#   SAME_AS=OLD.sqlite scripts/mutation.sh ...  # run the mutants an earlier session ran (before/after)
# MODULE is a path such as core/src/loopwright/_engine/_calls.py. cosmic-ray edits MODULE in
# place and restores it; run this in a worktree of its own, and check `git diff --stat core/src`.
# Mutants inside annotations are skipped (equivalent under `from __future__ import annotations`).
set -euo pipefail
cd "$(dirname "$0")/.."
module=$1; shift
[ $# -ge 1 ] || { echo "usage: $0 MODULE TEST_FILE..." >&2; exit 2; }
py=.venv/bin/python
[ -x .venv/bin/cosmic-ray ] || { echo "install it first: uv pip install cosmic-ray==8.7.0" >&2; exit 2; }
name=$(basename "$module" .py)
out=${OUT:-/tmp/mutation}; mkdir -p "$out"
cfg=$out/$name.toml; db=$out/$name.sqlite
cat > "$cfg" <<TOML
[cosmic-ray]
module-path = "$module"
timeout = ${TIMEOUT:-120.0}
excluded-modules = []
test-command = "nice -n 10 $py -m pytest -x -q -p no:randomly -p no:cacheprovider $*"
[cosmic-ray.distributor]
name = "local"
TOML
rm -f "$db"
.venv/bin/cosmic-ray init "$cfg" "$db"
"$py" - "$module" "$db" "${SAMPLE:-0}" "${SEED:-1}" "${SAME_AS:-}" <<'PY'
import ast, random, sqlite3, sys
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult

module, db, sample, seed, same_as = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
spans = []
for node in ast.walk(ast.parse(open(module).read())):
    notes = []
    if isinstance(node, ast.arg):
        notes.append(node.annotation)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        notes.append(node.returns)
    elif isinstance(node, ast.AnnAssign):
        notes.append(node.annotation)
    spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in notes if n]
with use_db(db, WorkDB.Mode.open) as work_db:
    # pending_work_items comes in random order (and job ids are random): sort by what each mutant
    # is, so that one SEED picks the same mutants on every init of the same source.
    def key(item):
        m = item.mutations[0]
        return (tuple(m.start_pos), m.operator_name, m.occurrence)
    items = sorted(work_db.pending_work_items, key=key)
    total, kept = len(items), []
    for item in items:
        pos = tuple(item.mutations[0].start_pos)
        if any(a <= pos < b for a, b in spans):
            work_db.set_result(item.job_id, WorkResult(output="annotation", worker_outcome=WorkerOutcome.SKIPPED))
        else:
            kept.append(item)
    if same_as:  # the mutants that session ran (not skipped), matched by position and operator
        old = sqlite3.connect(same_as)
        ran = {(r[0], r[1], r[2], r[3]) for r in old.execute(
            "SELECT m.start_pos_row, m.start_pos_col, m.operator_name, m.occurrence FROM mutation_specs m"
            " JOIN work_results r ON r.job_id = m.job_id WHERE r.worker_outcome != 'SKIPPED'")}
        chosen = [i for i in kept if (*key(i)[0], key(i)[1], key(i)[2]) in ran]
    elif not sample or sample >= len(kept):
        chosen = kept
    else:
        chosen = random.Random(seed).sample(kept, sample)
    ids = {i.job_id for i in chosen}
    for item in kept:
        if item.job_id not in ids:
            work_db.set_result(item.job_id, WorkResult(output="not sampled", worker_outcome=WorkerOutcome.SKIPPED))
    print(f"{module}: {total} mutants, {total - len(kept)} in annotations, running {len(chosen)}")
PY
start=$(date +%s)
.venv/bin/cosmic-ray exec "$cfg" "$db"
echo "exec took $(( $(date +%s) - start )) s"
.venv/bin/cr-report "$db" --show-pending | tail -n 4
git diff --quiet -- "$module" || { echo "WARNING: $module is still mutated; git checkout -- $module" >&2; exit 1; }
