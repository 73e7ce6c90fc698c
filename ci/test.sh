#!/usr/bin/env bash
# The README's test command: install, then the whole suite (unit, kernel parity, transports,
# LMCache, eval, the wheel) on the main environment (vLLM 0.32.0), then the vLLM plug-in's tests
# (tests/integration/vllm_ascend) on the second environment, vLLM 0.23.0 (ci/install.sh), the one
# vLLM-Ascend users run. The plug-in's serving tests (marked `serving`: vllm.LLM pairs, the
# OpenAI servers and proxy, failure modes, sampling, tensor parallelism, Gemma 3) run there
# only: each engine pair costs ~1.5 min of vLLM imports on 2 cores, and the 90-minute CI budget
# holds one run of them, not two. vLLM 0.32.0's engines stay covered end to end by the LMCache
# and Mooncake transports' tests (test_transports.py, tests/integration/lmcache), which need
# packages only the main environment has. Arguments go to the main run only (in place of the
# whole suite). Fails if any run fails.
#   LYNX_VLLM023=0  skip the vLLM 0.23.0 run (and its install); LYNX_SKIP_VLLM=1 skips it too;
#                   with LYNX_VLLM023=0 the `serving` tests run on the main environment instead
#   LYNX_TEST_WORKERS=N  processes for the tests that start no engine (default 2)
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
  # The tests that start no engine (the Triton kernels' under the interpreter most of it:
  # pure Python and numpy, one core each) spread over the cores with pytest-xdist; then the
  # engines' and servers' tests (`slow`) in one process, as their timings assume.
  # worksteal: some kernel tests take minutes; with xdist's default (load) one process was left
  # with a queue of them while the other idled (CPU 35.5 and 9.8 min after 38 min, 2026-11-30).
  python -m pytest -q -rs -n "${LYNX_TEST_WORKERS:-2}" --dist worksteal -m "not slow" \
    || status=$?
  serving=""
  if [ "${LYNX_SKIP_VLLM:-0}" != 1 ] && [ "${LYNX_VLLM023:-1}" = 1 ]; then
    serving=" and not serving"
  fi
  python -m pytest -q -rs -m "slow$serving" || status=$?
fi
if [ "${LYNX_SKIP_VLLM:-0}" != 1 ] && [ "${LYNX_VLLM023:-1}" = 1 ]; then
  venv="${LYNX_VLLM023_VENV:-.venv-vllm023}"
  echo "== vLLM 0.23.0 ($venv): tests/integration/vllm_ascend"
  "$venv/bin/python" -m pytest -q -rs -n "${LYNX_TEST_WORKERS:-2}" --dist worksteal \
    -m "not slow" tests/integration/vllm_ascend || status=$?
  "$venv/bin/python" -m pytest -q -rs -m slow tests/integration/vllm_ascend || status=$?
fi
exit $status
