#!/usr/bin/env bash
# The Mooncake transfer engine, for the Mooncake transport (lynx_npu/transport/mooncake.py) and
# its tests (tests/transport/test_mooncake.py); ci/install.sh calls this.
#
# - mooncake-transfer-engine-non-cuda from PyPI, --no-deps: the engine imports without the
#   packages it declares (aiohttp, requests, msgpack serve Mooncake's store and proxy).
# - Debian's libibverbs1 (libibverbs.so.1, which the engine links even for TCP), with
#   libnl-3-200 and libnl-route-3-200. Already on the machine: nothing to do. Else, as root,
#   apt-get install (after apt-get update). Else, or when that fails, apt-get download and
#   dpkg -x into .deps/libibverbs/ in the checkout (ignored by git); ci/test.sh then puts its
#   library folders on LD_LIBRARY_PATH (ci/mooncake_env.sh prints them).
# Then the engine must import, or this fails naming why.
#
#   LYNX_MOONCAKE=0        skip all of it (the Mooncake tests then skip, naming the import error)
#   LYNX_MOONCAKE_LOCAL=1  never apt-get install: always unpack into .deps/libibverbs/
#   PYTHON=...             the interpreter to install into (default: python)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${LYNX_MOONCAKE:-1}" = 1 ] || { echo "mooncake: skipped (LYNX_MOONCAKE=0)"; exit 0; }
py="${PYTHON:-python}"
"$py" -m pip --disable-pip-version-check -q install --no-deps \
  mooncake-transfer-engine-non-cuda==0.3.13.post1

debs="libibverbs1 libnl-3-200 libnl-route-3-200"
local_dir=.deps/libibverbs
have_system() { ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; }
unpack_local() {
  rm -rf "$local_dir" .deps/debs && mkdir -p "$local_dir" .deps/debs
  # apt-get download writes into the current folder; a root run warns that the _apt user
  # cannot write there (harmless: it downloads unsandboxed).
  download() { (cd .deps/debs && apt-get download $debs 2>&1 | grep -v "unsandboxed"); }
  if ! download && [ "$(id -u)" = 0 ]; then  # a fresh machine's package lists may be empty
    apt-get update -qq && download || true
  fi
  for deb in $debs; do
    ls .deps/debs/${deb}_*.deb >/dev/null 2>&1 || { echo "mooncake: apt-get download $deb failed" >&2; exit 1; }
  done
  for f in .deps/debs/*.deb; do dpkg -x "$f" "$local_dir"; done
  echo "mooncake: $debs unpacked into $local_dir"
}

if [ "${LYNX_MOONCAKE_LOCAL:-0}" = 1 ]; then
  unpack_local
elif have_system; then
  echo "mooncake: libibverbs.so.1 already on the system"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
          --no-install-recommends $debs >/dev/null; }; then
    echo "mooncake: apt-get install failed; unpacking the packages into $local_dir instead"
    unpack_local
  fi
else
  unpack_local
fi

LD_LIBRARY_PATH="$(bash ci/mooncake_env.sh)" "$py" - <<'PY'
from lynx_npu.transport.mooncake import unavailable_reason
reason = unavailable_reason()
if reason:
    raise SystemExit(f"mooncake: {reason}")
import importlib.metadata as md
print("mooncake: engine imports,", md.version("mooncake-transfer-engine-non-cuda"))
PY
