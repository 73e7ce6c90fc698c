"""The ``triton`` backend: the fused kernels of ``gpu/`` (installed as lynx_npu.gpu) on CUDA.

With ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors through Triton's interpreter
(slow; CI's parity tests use it), and an explicit ``backend="triton"`` accepts CPU tensors.
"""
from __future__ import annotations

import importlib.util

from .backends import BackendUnavailable

NAME = "triton"


def load():
    if importlib.util.find_spec("triton") is None:
        raise BackendUnavailable("triton is not installed (pip install 'lynx_npu[triton]')")
    import os

    import torch
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise BackendUnavailable("no CUDA device (torch.cuda.is_available() is False)")
    from lynx_npu.gpu import launch
    return launch
