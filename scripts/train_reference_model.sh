#!/usr/bin/env bash
# Reproduce src/optlab/reference/classifier/classifier.pt (seeded; about 4 minutes on 2 CPU cores).
set -euo pipefail; cd "$(dirname "$0")/.."; exec "${PYTHON:-.venv/bin/python}" -m optlab.reference.classifier.train "$@"
