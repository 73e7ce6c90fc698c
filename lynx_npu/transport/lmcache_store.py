"""LMCache's StorageManager as the object store of the LMCache transport (lmcache.py has the
design): configuration, object keys, and store / fetch / delete of whole objects.

Both sides build a StorageManager (LMCache 0.5's ``lmcache.v1.distributed``) whose L2 is the
``fs_native`` adapter on one directory they share; an object is one file there, written to a
temporary name and renamed, so a reader never sees half an object. A writer reserves L1 memory,
fills it, finishes the write; LMCache's store controller copies it to L2 and tells our listener
(``on_l2_keys_stored``), and the L1 copy is dropped. A reader submits prefetch tasks (one per
object size: LMCache sizes L1 buffers from the layout it is given) and copies the hits out of
its L1. LMCache is an optional dependency: importing this module does not need it, building an
LMCacheStore does (LMCacheUnavailable, naming the import error, otherwise).
"""
from __future__ import annotations

import json
import math
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# The object's cache_salt by kind: 48 (wire Kind.ERROR) is the abort a sender stores for a
# request it failed (lmcache_sender.py).
_KIND_SALT = {0: "header", 1: "anchor", 2: "residual", 48: "abort"}
HEADER_OBJECT_BYTES = 4096  # a request's header or abort object (a wire frame, zero padded)


class LMCacheUnavailable(RuntimeError):
    """LMCache (lmcache==0.5.6, installed with --no-deps) does not import here."""


def unavailable_reason() -> str | None:
    """None if LMCache's StorageManager imports here, else why not."""
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    try:
        from lmcache.v1.distributed.storage_manager import StorageManager  # noqa: F401
    except Exception as e:  # ImportError, or a broken native extension
        return f"lmcache does not import: {type(e).__name__}: {e}"
    return None


@dataclass(frozen=True)
class LMCacheConfig:
    directory: str                 # the L2 directory both instances share (one host, or a
                                   # shared filesystem): every object is a file in it
    l1_mb: int = 256               # this process's LMCache L1 (host memory staging objects)
    gbps: float | None = None      # receiver: emulated link rate of its reads; None = no limit
    poll_interval_s: float = 0.002  # receiver: how often objects not yet stored are looked up
    prefetch_timeout_s: float = 10.0  # one prefetch task (L2 -> L1 read) may take this long

    def __post_init__(self):
        if not isinstance(self.directory, str) or not self.directory:
            raise ValueError(f"directory={self.directory!r} must be a non-empty path (the L2 "
                             f"directory the prefill and decode instances share)")
        if not isinstance(self.l1_mb, int) or isinstance(self.l1_mb, bool) or self.l1_mb < 16:
            raise ValueError(f"l1_mb={self.l1_mb!r} must be an int >= 16")
        for name in ("poll_interval_s", "prefetch_timeout_s", "gbps"):
            value = getattr(self, name)
            if value is None and name == "gbps":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r} must be a positive finite number")


def namespace(port: int) -> str:
    """Objects meant for the decode receiver of ``port`` (its model_name in LMCache keys)."""
    return f"lynx-{port}"


class LMCacheStore:
    """One StorageManager over the shared directory, for one sender or one receiver (a
    receiver drops what it read from its L1, which would drop a sender's objects not yet in
    L2): give each its own, or let each build its own from an LMCacheConfig."""

    _count = 0

    def __init__(self, config: LMCacheConfig):
        why = unavailable_reason()
        if why is not None:
            raise LMCacheUnavailable(why)
        import torch
        from lmcache.v1.distributed.api import (GroupedObjectKeys, MemoryLayoutDesc, ObjectKey,
                                                PrefetchTaskSpec)
        from lmcache.v1.distributed.config import parse_args
        from lmcache.v1.distributed.internal_api import L2AdapterListener
        from lmcache.v1.distributed.storage_manager import StorageManager
        self._torch, self._ObjectKey, self._Layout = torch, ObjectKey, MemoryLayoutDesc
        self._Spec, self._Group = PrefetchTaskSpec, GroupedObjectKeys
        self.config = config
        os.makedirs(config.directory, exist_ok=True)
        args = ["--l1-size-gb", repr(config.l1_mb / 1024), "--eviction-policy", "LRU",
                "--l2-adapter", json.dumps({"type": "fs_native", "base_path": config.directory})]
        sm_config = parse_args(args)
        # LMCache names its L1's shared memory after the process: one per store instead
        LMCacheStore._count += 1
        sm_config.l1_manager_config.memory_config.shm_name = \
            f"lmcache_l1_pool_{os.getpid()}_{LMCacheStore._count}"
        self.sm = StorageManager(sm_config)
        self._lock = threading.Lock()
        self._on_stored: dict = {}  # ObjectKey -> callback(key), called once stored in L2
        self._closed = False
        store = self

        class _Listener(L2AdapterListener):
            def on_l2_keys_stored(self, keys, sizes):
                store._stored(keys)

            def on_l2_keys_accessed(self, keys):
                pass

            def on_l2_keys_deleted(self, keys):
                pass

        self.sm.register_l2_listener(_Listener())

    # -- keys -------------------------------------------------------------------------------------
    def key(self, space: str, request_id: int, kind: int, layer: int = 0, page: int = 0):
        """The object of (request, kind 0 header / 1 anchor / 2 residual / 48 abort, layer,
        page): anchor and residual of one page differ only in cache_salt."""
        return self._ObjectKey(chunk_hash=struct.pack(">QHI", request_id, layer, page),
                               model_name=space, kv_rank=0, cache_salt=_KIND_SALT[kind])

    # -- writing ----------------------------------------------------------------------------------
    def put(self, objects: list[tuple[object, bytes]], on_stored: Callable) -> list:
        """Write ``(key, bytes)`` objects into L1 (LMCache moves them to L2); ``on_stored(key)``
        is called once each is in L2. -> the keys L1 had no room for (try again later)."""
        by_size: dict[int, list] = {}
        for key, data in objects:
            by_size.setdefault(len(data), []).append((key, data))
        refused = []
        for size, group in by_size.items():
            keys = [k for k, _ in group]
            layout = self._Layout([self._torch.Size([size])], [self._torch.uint8])
            reserved = self.sm.reserve_write(keys, layout)
            done = []
            for key, data in group:
                obj = reserved.get(key)
                if obj is None:
                    refused.append(key)
                    continue
                obj.tensor.view(self._torch.uint8).reshape(-1)[:size].copy_(
                    self._torch.frombuffer(bytearray(data), dtype=self._torch.uint8))
                done.append(key)
            with self._lock:
                for key in done:
                    self._on_stored[key] = on_stored
            if done:
                self.sm.finish_write(done)
        return refused

    def _stored(self, keys) -> None:
        calls = []
        with self._lock:
            for key in keys:
                cb = self._on_stored.pop(key, None)
                if cb is not None:
                    calls.append((cb, key))
        if calls:
            self.sm.delete_l1_keys([k for _, k in calls])  # L2 has it: free the staging copy
        for cb, key in calls:
            cb(key)

    def forget(self, keys: Iterable) -> None:
        """Stop waiting for ``keys`` to be stored (their request failed)."""
        with self._lock:
            for key in keys:
                self._on_stored.pop(key, None)

    # -- reading ----------------------------------------------------------------------------------
    def fetch(self, wanted: list[tuple[object, int]]) -> dict:
        """Read the objects ``(key, size)`` that are stored now: -> {key: bytes}. Objects not
        (yet) in L2, or whose file is not ``size`` bytes, are left out."""
        by_size: dict[int, list] = {}
        for key, size in wanted:
            by_size.setdefault(size, []).append(key)
        out: dict = {}
        for size, keys in by_size.items():
            layout = self._Layout([self._torch.Size([size])], [self._torch.uint8])
            spec = self._Spec([self._Group(keys, 0, layout)], fetching_policy="full")
            handle = self.sm.submit_prefetch_task(spec)
            if not self.sm.wait_prefetch_status(handle, self.config.prefetch_timeout_s):
                continue
            result = self.sm.query_prefetch_status(handle)
            if result is None:
                continue
            hit = [keys[i] for i in result.hit_cells[0].get_indices_list()]
            if not hit:
                continue
            owners = {k: result.l1_owners[k] for k in hit if k in result.l1_owners}
            read = False
            with self.sm.read_prefetched_results(hit, owners or None) as objs:
                if objs is not None:
                    for key, obj in zip(hit, objs):
                        out[key] = obj.tensor.view(self._torch.uint8).reshape(-1)[
                            :size].numpy().tobytes()
                    read = True
            if read:  # else LMCache released the read locks itself
                self.sm.finish_read_prefetched(hit, 1, owners or None)
            self.sm.delete_l1_keys(hit, force=True)
        return out

    # -- deleting ---------------------------------------------------------------------------------
    def delete(self, keys: list, force: bool = True) -> None:
        """Remove objects from the shared L2 and from this process's L1 (``force=False``: not
        those LMCache is still copying to L2; such an object may then reach L2 after this)."""
        if not keys:
            return
        self.forget(keys)
        self.sm.delete_l1_keys(keys, force=force)
        adapters = self.sm.l2_adapters
        for _, adapter in (adapters() if callable(adapters) else adapters):
            adapter.delete(keys)

    def sweep(self, space: str) -> int:
        """Remove every object of ``space`` left in the directory (by an earlier process that
        did not release them). -> how many."""
        prefix, removed = space + "@", 0
        for name in os.listdir(self.config.directory):
            if name.startswith(prefix):
                try:
                    os.unlink(os.path.join(self.config.directory, name))
                    removed += 1
                except FileNotFoundError:
                    pass
        return removed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.sm.close()
