"""LMCache's serde interface around the Lynx object codec (serde.py), registered as ``"lynx"``.

Importing this module registers the factory with
``lmcache.v1.distributed.serde.factory.register_serde_factory`` (once per process); an L2
adapter then names it: ``"serde": {"type": "lynx", "head_dim": 64, "codec": "lynx"}``.
"""
from __future__ import annotations

import numpy as np
import torch
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.serde.async_processor import AsyncSerdeProcessor
from lmcache.v1.distributed.serde.base import Deserializer, SerdeProcessor, Serializer
from lmcache.v1.distributed.serde.factory import get_registered_serde_types, register_serde_factory
from lmcache.v1.memory_management import MemoryObj

from .serde import SERDE_NAME, LynxObjectCodec, LynxSerdeConfig


def kv_tensors(obj: MemoryObj) -> list[torch.Tensor]:
    """The KV tensor of each kernel group of an L1 object (one where it has no groups)."""
    shapes = getattr(obj.meta, "shapes", None)
    if shapes:
        return [obj.get_tensor(i) for i in range(len(shapes))]
    return [obj.tensor]


def byte_buffer(obj: MemoryObj) -> np.ndarray:
    """An object's bytes as a writable flat uint8 array (no copy)."""
    t = obj.tensor
    if t is None:
        raise ValueError("lynx serde: the byte buffer has no tensor (invalidated MemoryObj?)")
    return t.reshape(-1).view(torch.uint8).numpy()


class LynxSerializer(Serializer):
    def __init__(self, codec: LynxObjectCodec):
        self.codec = codec

    def serialize(self, src: MemoryObj, dst: MemoryObj, key: ObjectKey) -> int:
        return self.codec.serialize(kv_tensors(src), byte_buffer(dst))

    def estimate_serialized_size(self, layout_desc: MemoryLayoutDesc) -> int:
        """Exact: the fs adapter stores, and a load reads, this many bytes."""
        return self.codec.nbytes(layout_desc.shapes, layout_desc.dtypes)


class LynxDeserializer(Deserializer):
    def __init__(self, codec: LynxObjectCodec):
        self.codec = codec

    def deserialize(self, src: MemoryObj, dst: MemoryObj, key: ObjectKey) -> None:
        self.codec.deserialize(byte_buffer(src), kv_tensors(dst))


def create_lynx_serde(kwargs: dict[str, object]) -> SerdeProcessor:
    """LMCache's factory: ``SerdeConfig.kwargs`` -> an async processor (bad kwargs raise a
    ValueError naming them)."""
    config = LynxSerdeConfig.from_kwargs(dict(kwargs))
    codec = LynxObjectCodec(config)
    return AsyncSerdeProcessor(LynxSerializer(codec), LynxDeserializer(codec),
                               max_workers=config.max_workers)


def register() -> None:
    """Register the factory (a no-op when this process has already)."""
    if SERDE_NAME not in get_registered_serde_types():
        register_serde_factory(SERDE_NAME, create_lynx_serde)


register()
