#!/usr/bin/env bash
# Build every first-party distribution's sdist and wheel, as a release would, and check them.
#
# 1. `uv build --all-packages` into a folder (DIST, default: a temporary one), then the provider
#    guide's example package (loopwright-example-echo: a third party's, never released with
#    loopwright) is taken out.
# 2. Every first-party distribution has exactly one sdist and one wheel, all of one version
#    (the meta-package's).
# 3. `twine check --strict` on each: the metadata and the README render as PyPI would show them.
#
# .ci/run calls it; .github/workflows/release.yml runs the same with DIST=dist before publishing.
source "$(dirname "${BASH_SOURCE[0]}")/_bootstrap.sh"
if [ -n "${DIST:-}" ]; then
  rm -rf "$DIST"; mkdir -p "$DIST"; DIST="$(cd "$DIST" && pwd)"
else
  DIST="$(mktemp -d)"; trap 'rm -rf "$DIST"' EXIT
fi
echo "release check: uv build --all-packages (sdists and wheels) ..." >&2
uv build --quiet --all-packages -o "$DIST" >&2
rm -f "$DIST"/loopwright_example_echo-* "$DIST"/.gitignore  # uv build writes a .gitignore there
uv run --no-sync python - "$DIST" <<'PY'
import sys, tomllib
from pathlib import Path

dist = Path(sys.argv[1])
root = Path.cwd()
paths = [root / "pyproject.toml", root / "core" / "pyproject.toml", *sorted(root.glob("plugins/*/pyproject.toml"))]
projects = [tomllib.loads(p.read_text())["project"] for p in paths]
names = [p["name"] for p in projects if p["name"] != "loopwright-example-echo"]
version = next(p["version"] for p in projects if p["name"] == "loopwright")
expected = set()
for name in names:
    stem = f"{name.replace('-', '_')}-{version}"
    expected |= {f"{stem}.tar.gz", f"{stem}-py3-none-any.whl"}
found = {p.name for p in dist.iterdir()}
assert found == expected, f"missing: {sorted(expected - found)}; unexpected: {sorted(found - expected)}"
print(f"release check: {len(names)} distributions at {version}, an sdist and a wheel each", file=sys.stderr)
PY
uv run --no-sync twine check --strict "$DIST"/*
