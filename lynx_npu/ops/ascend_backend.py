"""The ``ascend_c`` backend hook: the Ascend C custom op for ``npu`` tensors.

The kernels live in ``ascend_c/`` and are built with CANN; ``ascend_c_host.npu_backend``
loads the built operator library (torch.ops.lynx_ascend) behind the ops interface, and raises
BackendUnavailable with the reason (no torch_npu, library not built) otherwise. A different
build can replace this loader: ``register_backend("ascend_c", ("npu",), loader, replace=True)``.
"""
from __future__ import annotations


def load():
    from .ascend_c_host import npu_backend
    return npu_backend()
