"""Codec registry: ``get_codec(name, **overrides)`` builds a codec by name."""
from __future__ import annotations

from typing import Callable

from .base import Codec

_FACTORIES: dict[str, Callable[..., Codec]] = {}


def register_codec(name: str, factory: Callable[..., Codec]) -> None:
    if name in _FACTORIES:
        raise ValueError(f"codec {name!r} is already registered")
    _FACTORIES[name] = factory


def list_codecs() -> list[str]:
    return sorted(_FACTORIES)


def get_codec(name: str, **overrides) -> Codec:
    """Build the codec ``name``; unknown names and bad parameters raise ValueError."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known codecs: {', '.join(list_codecs())}") from None
    try:
        return factory(**overrides)
    except TypeError as e:  # unexpected keyword -> a user error, not a crash
        raise ValueError(f"bad parameter for codec {name!r}: {e}") from None
