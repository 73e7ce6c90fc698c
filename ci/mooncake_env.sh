#!/usr/bin/env bash
# Prints LD_LIBRARY_PATH with the library folders of .deps/libibverbs/ (where
# ci/install_mooncake.sh unpacks libibverbs1 when it cannot install it) put first, if there
# are any; otherwise LD_LIBRARY_PATH as it is. Usage:
#   export LD_LIBRARY_PATH="$(bash ci/mooncake_env.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
path="${LD_LIBRARY_PATH:-}"
for d in "$PWD"/.deps/libibverbs/usr/lib/*-linux-gnu "$PWD"/.deps/libibverbs/lib/*-linux-gnu; do
  [ -d "$d" ] && path="$d${path:+:$path}"
done
printf '%s\n' "$path"
