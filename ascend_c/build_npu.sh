#!/usr/bin/env bash
# Builds the Lynx Ascend C kernels + torch_npu operators with CANN (Atlas A2 by default).
#   SOC_VERSION=Ascend910B3 bash ascend_c/build_npu.sh
# Needs: CANN toolkit (its set_env.sh sourced, or ASCEND_HOME_PATH set), torch + torch_npu in
# the active Python. Output: ascend_c/out/liblynx_ascend_ops.so. Not run here: no CANN in CI.
set -euo pipefail
cd "$(dirname "$0")"
if [ -z "${ASCEND_HOME_PATH:-}" ]; then
  for env in /usr/local/Ascend/ascend-toolkit/set_env.sh "$HOME/Ascend/ascend-toolkit/set_env.sh"; do
    # shellcheck disable=SC1090
    [ -f "$env" ] && source "$env" && break
  done
fi
: "${ASCEND_HOME_PATH:?source the CANN set_env.sh first (ASCEND_HOME_PATH is unset)}"
cmake -S . -B build -DSOC_VERSION="${SOC_VERSION:-Ascend910B1}" -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
cmake --install build
echo "built: $(pwd)/out/liblynx_ascend_ops.so"
