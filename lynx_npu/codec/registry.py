"""Codec registry: ``get_codec(name, **overrides)`` builds a codec by name.

``CODEC_IDS`` are the stable numbers the wire header carries (never reuse or renumber one).
"""
from __future__ import annotations

from typing import Callable

from .base import Codec

CODEC_IDS: dict[str, int] = {
    "bf16": 1, "int8": 2, "int4": 3, "kivi4": 4, "quantspec": 5, "cachegen": 6,
    "lynx-int4": 7, "lynx-int8": 8, "lynx": 9,
}

_FACTORIES: dict[str, Callable[..., Codec]] = {}


def register_codec(name: str, factory: Callable[..., Codec]) -> None:
    if name in _FACTORIES:
        raise ValueError(f"codec {name!r} is already registered")
    if name not in CODEC_IDS:
        raise ValueError(f"codec {name!r} has no wire id in CODEC_IDS")
    _FACTORIES[name] = factory


def list_codecs() -> list[str]:
    return sorted(_FACTORIES, key=CODEC_IDS.__getitem__)


def get_codec(name: str, **overrides) -> Codec:
    """Build the codec ``name``; unknown names and bad parameters raise ValueError."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known codecs: {', '.join(list_codecs())}") from None
    try:
        codec = factory(**overrides)
    except TypeError as e:  # unexpected keyword -> a user error, not a crash
        raise ValueError(f"bad parameter for codec {name!r}: {e}") from None
    codec.codec_id = CODEC_IDS[name]
    return codec


def codec_from_wire(codec_id: int, params: dict) -> Codec:
    """Rebuild on the receiver the codec a frame header names."""
    for name, cid in CODEC_IDS.items():
        if cid == codec_id:
            if name not in _FACTORIES:
                raise ValueError(f"codec id {codec_id} ({name!r}) is not available here")
            return get_codec(name, **params)
    raise ValueError(f"unknown codec id {codec_id}; known ids: {sorted(CODEC_IDS.values())}")
