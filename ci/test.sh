#!/usr/bin/env bash
# The README's test command: install, then run the whole suite (unit, integration, e2e) on the
# main environment (vLLM 0.32.0), then the vLLM plug-in's tests (tests/integration/vllm_ascend:
# the unit tests, the vllm.LLM end-to-end tests and the OpenAI servers + proxy test) again on
# the second environment, vLLM 0.23.0 (ci/install.sh). Arguments go to the main run only
# (in place of the whole suite). Fails if any run fails.
#   LYNX_VLLM023=0  skip the vLLM 0.23.0 run (and its install); LYNX_SKIP_VLLM=1 skips it too
#   LYNX_TEST_WORKERS=N  processes for tests/gpu (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
export TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export LMCACHE_TRACK_USAGE=false  # LMCache reports usage to its authors unless told not to
# libibverbs unpacked into .deps/ when it could not be installed (ci/install_mooncake.sh)
LD_LIBRARY_PATH="$(bash ci/mooncake_env.sh)" && export LD_LIBRARY_PATH
export MC_LOG_LEVEL="${MC_LOG_LEVEL:-ERROR}"  # the Mooncake engine logs at INFO otherwise
status=0
if [ $# -gt 0 ]; then
  python -m pytest -q -rs "$@" || status=$?
else
  # The Triton kernels' tests run under the interpreter, pure Python and numpy on one core
  # each: spread over the cores (pytest-xdist; on 2 cores 12.5 min instead of 24), then the
  # rest of the suite, engines and servers included, in one process.
  python -m pytest -q -rs -n "${LYNX_TEST_WORKERS:-2}" tests/gpu || status=$?
  python -m pytest -q -rs --ignore=tests/gpu || status=$?
fi
if [ "${LYNX_SKIP_VLLM:-0}" != 1 ] && [ "${LYNX_VLLM023:-1}" = 1 ]; then
  venv="${LYNX_VLLM023_VENV:-.venv-vllm023}"
  echo "== vLLM 0.23.0 ($venv): tests/integration/vllm_ascend"
  "$venv/bin/python" -m pytest -q -rs tests/integration/vllm_ascend || status=$?
fi
exit $status
