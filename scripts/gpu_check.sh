#!/usr/bin/env bash
# The one-shot GPU check (scripts/gpu_check.py): run from a checkout on a CUDA machine,
# no network needed once set up. Under 8 minutes; writes gpu_check.json (or the file given).
#   scripts/gpu_check.sh [--json FILE] [--quick] [--only STAGE ...]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
exec "$PYTHON" scripts/gpu_check.py "$@"
