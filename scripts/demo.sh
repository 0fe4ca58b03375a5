#!/usr/bin/env bash
# The quick-start demo: fingerprint the machine, then walk the reference chain.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
export OPTLAB_DB="${OPTLAB_DB:-sqlite:///$PWD/.optlab/demo.db}"
set -x
optlab env
optlab diff experiments/baseline.yaml
optlab diff experiments/01-dynamic-batch.yaml
optlab diff experiments/02-fp16.yaml
optlab diff experiments/03-preprocess.yaml
optlab db current
