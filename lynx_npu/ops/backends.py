"""Backend registry: which implementation of the Lynx ops runs for a tensor's device.

| device | default backend | built from |
| ------ | --------------- | ---------- |
| cuda   | ``triton``      | ``gpu/`` (installed as ``lynx_npu.gpu``) |
| cpu    | ``cpu``         | ``lynx_npu/ops/cpu/lynx_cpu.cpp``, JIT-built with the system C++ compiler |
| npu    | ``ascend_c``    | ``ascend_c/`` through CANN (registered by the Ascend C op when built) |
| any    | ``torch``       | the reference, ``lynx_npu.codec`` |

The choice is ``backend=`` if given, else the ``LYNX_BACKEND`` environment variable, else
``auto``. ``auto`` takes the device's default and falls back quietly to ``torch`` when that
backend is missing or does not support the configuration; an explicit choice that cannot run
raises :class:`BackendUnavailable` with the reason.

A backend is a module-like object with ``supports(cfg, num_kv_heads, head_dim, dtype)``
(None, or the reason it cannot run: each backend declares what it implements, chunk centres
included; nothing here keeps a table of it), ``compress(k, v, plan, out_anchor, out_residual)`` and
``decompress(anchor, residual, plan, dest)`` (see ops/api.py for ``dest``).
"""
from __future__ import annotations

import enum
import importlib
import os
from dataclasses import dataclass, field
from typing import Callable

ENV_VAR = "LYNX_BACKEND"


class Backend(str, enum.Enum):
    AUTO = "auto"
    TORCH = "torch"
    CPU = "cpu"
    TRITON = "triton"
    ASCEND_C = "ascend_c"


class BackendUnavailable(RuntimeError):
    """An explicitly chosen backend cannot run here; the message says why."""


@dataclass
class _Entry:
    name: str
    devices: tuple[str, ...] | None   # None: every device
    loader: Callable[[], object]
    impl: object | None = None
    error: str | None = None
    loaded: bool = field(default=False)

    def load(self):
        if not self.loaded:
            try:
                self.impl = self.loader()
            except BackendUnavailable as e:
                self.error = str(e)
            except Exception as e:  # a broken optional dependency must not break auto mode
                self.error = f"{type(e).__name__}: {e}"
            self.loaded = True
        return self.impl


_REGISTRY: dict[str, _Entry] = {}
DEVICE_DEFAULT = {"cuda": Backend.TRITON.value, "cpu": Backend.CPU.value,
                  "npu": Backend.ASCEND_C.value}


def register_backend(name: str, devices: tuple[str, ...] | None, loader: Callable[[], object],
                     *, replace: bool = False) -> None:
    """Register ``loader`` (returns the backend, or raises BackendUnavailable with a reason)."""
    if name in _REGISTRY and not replace:
        raise ValueError(f"backend {name!r} is already registered")
    _REGISTRY[name] = _Entry(name, devices, loader)


def _module_loader(module: str) -> Callable[[], object]:
    def load():
        mod = importlib.import_module(module)
        return mod.load() if hasattr(mod, "load") else mod
    return load


register_backend("torch", None, _module_loader("lynx_npu.ops.torch_backend"))
register_backend("cpu", ("cpu",), _module_loader("lynx_npu.ops.cpu_backend"))
# Under TRITON_INTERPRET=1 the Triton kernels also run (slowly) on CPU tensors, when asked for.
register_backend("triton", ("cuda", "cpu") if os.environ.get("TRITON_INTERPRET") == "1" else ("cuda",),
                 _module_loader("lynx_npu.ops.triton_backend"))
register_backend("ascend_c", ("npu",), _module_loader("lynx_npu.ops.ascend_backend"))


def list_backends() -> dict[str, str | None]:
    """Every registered backend -> None if it loads here, else the reason it does not."""
    out = {}
    for name, e in _REGISTRY.items():
        e.load()
        out[name] = e.error
    return out


def _requested(backend: str | Backend | None) -> str:
    if backend is None:
        backend = os.environ.get(ENV_VAR, "").strip() or Backend.AUTO.value
    name = backend.value if isinstance(backend, Backend) else str(backend).lower()
    if name != Backend.AUTO.value and name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r} (from {ENV_VAR} or backend=); backends: "
                         f"auto, {', '.join(_REGISTRY)}")
    return name


def select(device, backend: str | Backend | None, cfg, num_kv_heads: int, head_dim: int,
           dtype) -> tuple[str, object]:
    """-> (name, implementation) for tensors on ``device``."""
    dev = device.type if hasattr(device, "type") else str(device).split(":")[0]
    name = _requested(backend)
    if name != Backend.AUTO.value:
        e = _REGISTRY[name]
        if e.devices is not None and dev not in e.devices:
            raise BackendUnavailable(f"backend {name!r} runs on {', '.join(e.devices)} tensors; "
                                     f"these are on {dev}")
        impl = e.load()
        if impl is None:
            raise BackendUnavailable(f"backend {name!r} is not available: {e.error}")
        why = impl.supports(cfg, num_kv_heads, head_dim, dtype)
        if why:
            raise BackendUnavailable(f"backend {name!r} cannot run this input: {why}")
        return name, impl
    default = DEVICE_DEFAULT.get(dev)
    if default is not None:
        impl = _REGISTRY[default].load()
        if impl is not None and not impl.supports(cfg, num_kv_heads, head_dim, dtype):
            return default, impl
    return "torch", _REGISTRY["torch"].load()
