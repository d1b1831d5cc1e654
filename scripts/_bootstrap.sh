# Sourced by the other scripts: makes sure uv is on PATH and the workspace venv is in sync.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export UV_PYTHON_DOWNLOADS=never
if ! command -v uv >/dev/null 2>&1; then
  if [ -x "$HOME/.local/bin/uv" ]; then
    export PATH="$HOME/.local/bin:$PATH"
  else
    echo "installing uv with pip ..." >&2
    python3 -m pip install --quiet --user uv 2>/dev/null || python3 -m pip install --quiet uv
    export PATH="$HOME/.local/bin:$PATH"
  fi
fi
cd "$ROOT"
# The extras a2a and agui: the optional packages of loopwright-serve's surfaces (a2a-sdk,
# ag-ui-protocol) are installed too, so their tests run.
uv sync --quiet --all-packages --extra a2a --extra agui
