"""The Mooncake transfer engine as the Mooncake transport uses it: one engine per side, host
buffers registered with it, batches of one-sided reads from a peer's segment.

The engine comes from PyPI: ``mooncake-transfer-engine-non-cuda`` (CPU hosts; TCP, and RDMA
through libibverbs), ``mooncake-transfer-engine`` (CUDA) or the ``-npu`` build / a CANN source
build with the "ascend" protocol (vLLM-Ascend's disaggregated-prefill connectors); all share the
Python API used here (``mooncake.engine.TransferEngine``: initialize, get_rpc_port,
register_memory, unregister_memory, batch_transfer_sync_read). Peers meet by P2P handshake (no
metadata server): an engine listens on ``host`` at the port ``get_rpc_port`` reports, and its
segment is named ``"host:port"``. The engine logs through glog at INFO; ``MC_LOG_LEVEL=ERROR``
keeps errors only (it logs "Local segment descriptor not found" at start-up, harmlessly). A
read from an unresponsive peer gives up after ``MC_TRANSFER_TIMEOUT`` seconds (default 30).
"""
from __future__ import annotations

import collections
import ipaddress
import math
import threading
import time
from dataclasses import dataclass

import torch

from .config import LOOPBACK
from .errors import TransferError
from .mooncake_descriptor import join_segment

PROTOCOLS = ("tcp", "rdma", "ascend")
RETIRE_S = 2.0  # an unregistered buffer is freed this long after, never while a read may use it
INSTALL_HINT = ("pip install --no-deps mooncake-transfer-engine-non-cuda==0.3.13.post1 and "
                "Debian's libibverbs1 (ci/install.sh does both; docs/transport.md)")


class EngineUnavailable(ImportError):
    """The Mooncake transfer engine cannot be imported here; the message says why."""


def engine_class():
    """``mooncake.engine.TransferEngine``, or EngineUnavailable naming the import error."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:  # not installed, or a shared library (libibverbs.so.1) missing
        raise EngineUnavailable(f"the Mooncake transfer engine cannot be imported ({e}); "
                                f"{INSTALL_HINT}") from e
    return TransferEngine


def unavailable_reason() -> str | None:
    """Why the engine cannot be used here, or None if it imports."""
    try:
        engine_class()
    except EngineUnavailable as e:
        return str(e)
    return None


@dataclass(frozen=True)
class MooncakeConfig:
    """One side's transfer engine, and how the receiver reads through it."""

    host: str = LOOPBACK            # IP address the engine serves its segment on
    protocol: str = "tcp"           # "tcp" (CI), "rdma" (RoCE / InfiniBand), "ascend" (NPU build)
    device_name: str = ""           # NICs / devices to use, comma separated; "" = all found
    gbps: float | None = None       # receiver: emulated link rate of engine reads; None = none
    batch_bytes: int = 4 << 20      # receiver: bytes per batch read (its registered staging)
    read_retries: int = 2           # receiver: a failed or corrupt read is tried again this often
    max_pending_pages: int = 16384  # receiver: page descriptors queued before the control
                                    # connection is read no further (back-pressure)

    def __post_init__(self):
        try:
            ipaddress.ip_address(self.host)
        except (TypeError, ValueError):
            raise ValueError(f"{self.host=} must be an IP address (the engine's segment is "
                             f"named ip:port)") from None
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"{self.protocol=} must be one of {PROTOCOLS}")
        if not isinstance(self.device_name, str) or not (
                self.device_name.isascii() and self.device_name.isprintable()
                and " " not in self.device_name):
            raise ValueError(f"{self.device_name=} must be ASCII device names, comma separated")
        if self.gbps is not None and (not isinstance(self.gbps, (int, float))
                                      or isinstance(self.gbps, bool)
                                      or not (math.isfinite(self.gbps) and self.gbps > 0)):
            raise ValueError(f"{self.gbps=} must be a positive finite number or None")
        for name, low in (("batch_bytes", 64 << 10), ("read_retries", 0),
                          ("max_pending_pages", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}={value!r} must be an int >= {low}")


class MooncakeEngine:
    """One TransferEngine and the host buffers registered with it. Thread-safe; may be shared
    by several senders of one process."""

    def __init__(self, config: MooncakeConfig = MooncakeConfig()):
        self.config = config
        self._engine = engine_class()()
        rc = self._engine.initialize(config.host, "P2PHANDSHAKE", config.protocol,
                                     config.device_name)
        if rc != 0:
            raise TransferError(f"Mooncake TransferEngine.initialize({config.host!r}, "
                                f"'P2PHANDSHAKE', {config.protocol!r}, {config.device_name!r}) "
                                f"returned {rc}")
        self.segment = join_segment(config.host, self._engine.get_rpc_port())
        self._lock = threading.Lock()
        self._buffers: dict[int, torch.Tensor] = {}   # address -> the registered buffer
        self._retired: collections.deque = collections.deque()  # (unregistered at, buffer)
        self.closed = False

    def buffer(self, nbytes: int) -> tuple[torch.Tensor, int]:
        """A new host buffer of ``nbytes``, registered: (uint8 tensor, its address)."""
        if not isinstance(nbytes, int) or nbytes < 1:
            raise ValueError(f"{nbytes=} must be a positive int")
        buf = torch.empty(nbytes, dtype=torch.uint8)
        addr = buf.data_ptr()
        with self._lock:
            if self.closed:
                raise TransferError("the Mooncake engine is closed")
            rc = self._engine.register_memory(addr, nbytes)
            if rc != 0:
                raise TransferError(f"Mooncake register_memory of {nbytes} bytes returned {rc}")
            self._buffers[addr] = buf
        return buf, addr

    def release(self, addr: int) -> None:
        """Unregister the buffer at ``addr`` (a peer's read of it then fails); its memory is
        freed ``RETIRE_S`` later, so a read the engine had already begun never lands in (or
        sends from) memory that was reused."""
        now = time.monotonic()
        with self._lock:
            buf = self._buffers.pop(addr, None)
            if buf is not None:
                self._engine.unregister_memory(addr)
                self._retired.append((now, buf))
            while self._retired and now - self._retired[0][0] > RETIRE_S:
                self._retired.popleft()

    def read(self, segment: str, local: list[int], remote: list[int], lengths: list[int]) -> int:
        """Read ``lengths[i]`` bytes at ``remote[i]`` of ``segment`` into ``local[i]`` (this
        engine's registered memory), all in one batch; -> the engine's status (0: done)."""
        return self._engine.batch_transfer_sync_read(segment, local, remote, lengths)

    @property
    def num_buffers(self) -> int:
        with self._lock:
            return len(self._buffers)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            buffers, self._buffers = self._buffers, {}
            for addr in buffers:
                self._engine.unregister_memory(addr)
            self._retired.extend((time.monotonic(), buf) for buf in buffers.values())
        del buffers
