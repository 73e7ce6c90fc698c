"""The ``ascend_c`` backend hook: the Ascend C custom op for ``npu`` tensors.

The kernels live in ``ascend_c/`` and are built with CANN; when that build registers its torch
op it replaces this loader (``register_backend("ascend_c", ("npu",), loader, replace=True)``)
with one that returns a module implementing ``supports`` / ``compress`` / ``decompress`` as in
ops/torch_backend.py. Until then the backend reports why it cannot run.
"""
from __future__ import annotations

import importlib.util

from .backends import BackendUnavailable


def load():
    if importlib.util.find_spec("torch_npu") is None:
        raise BackendUnavailable("torch_npu is not installed (no Ascend NPU stack on this host)")
    raise BackendUnavailable("the Ascend C Lynx op is not built: build ascend_c/ with CANN "
                             "(ascend_c/README) so it registers itself")
