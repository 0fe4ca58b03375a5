#!/usr/bin/env bash
# The quick-start demo: fingerprint the machine, check the reference chain, then measure the
# synthetic example chain with the quick (PROVISIONAL) protocol.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
export OPTLAB_DB="${OPTLAB_DB:-sqlite:///$PWD/.optlab/demo.db}"
set -x
optlab env
optlab diff experiments/03-preprocess.yaml
optlab run experiments/examples/synthetic/01-faster-service.yaml --quick --chain
optlab run experiments/examples/textclf/01-dynamic-batch.yaml --quick --chain
optlab log
