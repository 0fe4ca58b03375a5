#!/usr/bin/env bash
# Reproduce src/optlab/reference/llm/llm.pt (seeded; about 5 minutes on 2 CPU cores).
set -euo pipefail; cd "$(dirname "$0")/.."; exec "${PYTHON:-.venv/bin/python}" -m optlab.reference.llm.train "$@"
