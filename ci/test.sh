#!/usr/bin/env bash
# The README's test command: install, then run the whole suite (unit, integration, e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
export TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python -m pytest -q -rs "$@"
