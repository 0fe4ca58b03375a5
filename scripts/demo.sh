#!/usr/bin/env bash
# The quick-start demo: set up, then `optlab demo` measures the reference chain that suits this
# machine (the GPU chain where CUDA is available, the CPU chain otherwise) under the quick
# protocol into a fresh database, and prints the stacked-gains table. About 2-3 minutes on a
# 2-core CPU; the first run also exports and quantises the onnxruntime models (cached after).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
optlab demo
