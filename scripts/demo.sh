#!/usr/bin/env bash
# The quick-start demo: fingerprint the machine, check the reference chain, then measure two
# example chains with the quick (PROVISIONAL) protocol. A refused or INVALID step is part of
# what the demo shows (a noisy machine can invalidate a run), so it does not stop the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
export OPTLAB_DB="${OPTLAB_DB:-sqlite:///$PWD/.optlab/demo.db}"
set -x
optlab env
optlab diff experiments/03-preprocess.yaml
optlab run experiments/examples/synthetic/01-faster-service.yaml --quick --chain || true
optlab run experiments/examples/textclf/02-numpy-tokenizer.yaml --quick --chain || true
optlab log
