"""Host staging of wire bytes for caches that live on an accelerator.

The wire is host memory; a GPU / NPU cache is not. The serde moves a layer's frames between
them through page-locked (pinned) host buffers with non-blocking copies on a side stream, so
the copy of layer i overlaps the kernels of layer i+1, and waits only where bytes are read:
``Staged.wait()`` before the transport touches them. On the CPU there is nothing to stage.
"""
from __future__ import annotations

import threading

import torch


def is_host(device: torch.device) -> bool:
    return torch.device(device).type == "cpu"


def _module(device: torch.device):
    """torch.cuda / torch.npu: the device module with streams and events."""
    return getattr(torch, torch.device(device).type)


def host_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 host buffer for copies to / from ``device`` (pinned where the device has it)."""
    pin = not is_host(device) and _module(device).is_available()
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)


class Staged:
    """Host bytes of one device-side copy, with the event that says they have landed
    (``small``: a small tensor copied with them, e.g. a compress kernel's flags)."""

    def __init__(self, host: torch.Tensor, event=None, small: torch.Tensor | None = None):
        self.host, self._event, self.small = host, event, small

    def wait(self) -> torch.Tensor:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self.host


class DeviceCopier:
    """Copies between one device and pinned host memory on a stream of their own."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._stream = None
        self._lock = threading.Lock()

    def _side(self):
        with self._lock:
            if self._stream is None:
                self._stream = _module(self.device).Stream(device=self.device)
            return self._stream

    def to_host(self, src: torch.Tensor, small: torch.Tensor | None = None) -> Staged:
        """Start copying ``src`` (uint8, on the device), and ``small`` if given, to pinned
        buffers."""
        if is_host(self.device):
            return Staged(src, small=small)
        mod = _module(self.device)
        host = host_buffer(src.numel(), self.device)
        small_host = None
        if small is not None:
            small_host = torch.empty(small.shape, dtype=small.dtype, pin_memory=True)
        side = self._side()
        side.wait_stream(mod.current_stream(self.device))  # after the kernels that wrote src
        with mod.stream(side):
            if small is not None:
                small_host.copy_(small, non_blocking=True)
                small.record_stream(side)
            host.copy_(src, non_blocking=True)
            src.record_stream(side)
            event = mod.Event()
            event.record(side)
        return Staged(host, event, small_host)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        """Copy pinned ``host`` bytes to a new device buffer, ordered before later work on the
        current stream (the kernels that read it)."""
        if is_host(self.device):
            return host
        mod = _module(self.device)
        out = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
        out.copy_(host, non_blocking=host.is_pinned())
        return out
