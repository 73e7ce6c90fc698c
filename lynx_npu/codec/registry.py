"""Codec registry: ``get_codec(name, **overrides)`` builds a codec by name.

``CODEC_IDS`` are the stable numbers the wire header carries (never reuse or renumber one).

A frame carries its codec's parameters (``wire_params``): ``PAYLOAD_FORMAT`` and every entry of
``codec.params()``, defaults included. ``codec_from_wire`` rebuilds the codec from them alone:
a missing or unknown key, or a value of the wrong type or range, is a ValueError naming it,
never a default. PAYLOAD_FORMAT versions what payload bytes and parameters mean; the frame
header has its own version (lynx_npu.wire.VERSION).

    format 1  (before this key existed) parameters were partial and defaults filled the rest,
              so a frame's meaning moved with each default: the chunk centre, the alphas,
              scalar previews (a frame without "scalar_preview" meant True).
    format 2  every parameter explicit; lynx pages as lynx_layout.py and lynx_stream.py
              describe them, the baselines as baselines.py and cachegen.py do.
    format 3  lynx's ``recent_tokens``: the page(s) holding a layer's last tokens carry their
              residual codes and exact scalars after the anchor (lynx_layout.window_layout).
    format 4  lynx's ``v_chunk_size``: V's chunks have their own size (``chunk_size`` is K's).
    format 5  lynx's ``v_anchor_bits`` (V's split; ``anchor_bits`` is K's) and
              ``layer_anchor_bits`` (a split per layer, the JSON text of [[layer, K, V], ...]:
              parameters on the wire are scalars).
    format 6  lynx's ``layer_v_chunk_size`` (V's chunk size per layer, JSON text of
              [[layer, V chunk], ...]).
    format 7  lynx's ``scalar_grid``: on the "byte" grid (the default) the chunk scalars are
              one of 256 values each, the anchor carries them once as bytes, and neither the
              residual nor a window repeats them (lynx_tables.py, lynx_stream.py).
    format 8  lynx's end cells: the anchor cells 0 and top decode 2^r levels each from their
              residual field (2 d + 1 - h there; lynx_tables "the end cells"): same bytes and
              parameters, other full-stage values.
    format 9  lynx's recent-token window sent once: a windowed page's residual stream leaves
              out the window's rows (each head's last rows; lynx_layout.windowed_residual),
              which its anchor's window carries.

Bump PAYLOAD_FORMAT whenever any codec's bytes, parameters or defaults change meaning, and
regenerate the golden payloads (tests/wire/make_golden.py).
"""
from __future__ import annotations

import functools
from typing import Callable

from .base import Codec

CODEC_IDS: dict[str, int] = {
    "bf16": 1, "int8": 2, "int4": 3, "kivi4": 4, "quantspec": 5, "cachegen": 6,
    "lynx-int4": 7, "lynx-int8": 8, "lynx": 9,
}
PAYLOAD_FORMAT = 9
FORMAT_KEY = "payload_format"

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
    if overrides:
        known = parameter_names(name) | _api_only(factory)
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"bad parameter for codec {name!r}: it has no parameter "
                             f"{', '.join(map(repr, unknown))}; its parameters: "
                             f"{', '.join(sorted(known))}")
    try:
        codec = factory(**overrides)
    except TypeError as e:  # a factory's own signature error -> a user error, not a crash
        raise ValueError(f"bad parameter for codec {name!r}: {e}") from None
    codec.codec_id = CODEC_IDS[name]
    return codec


def _api_only(factory) -> frozenset[str]:
    """Named arguments of a factory that are not codec parameters (lynx's ``preset``)."""
    import inspect
    return frozenset(n for n, p in inspect.signature(factory).parameters.items()
                     if p.kind is not p.VAR_KEYWORD)


def wire_params(codec: Codec) -> dict:
    """The parameters a frame of ``codec`` carries: the payload format and every parameter."""
    params = codec.params()
    assert FORMAT_KEY not in params, f"{codec.name} must not define {FORMAT_KEY!r}"
    return {FORMAT_KEY: PAYLOAD_FORMAT, **params}


@functools.lru_cache(maxsize=None)
def parameter_names(name: str) -> frozenset[str]:
    """The keys of ``get_codec(name).params()``: what a frame of codec ``name`` must carry."""
    return frozenset(get_codec(name).params())


def codec_from_params(name: str, params: dict) -> Codec:
    """Rebuild codec ``name`` from a frame's parameters (``wire_params`` of the sender's codec).

    Strict: the payload format must be this build's, every parameter must be present and none
    unknown; values are checked by the codec's own constructor, as ``get_codec`` checks them."""
    if name not in _FACTORIES:
        raise ValueError(f"codec {name!r} is not available here; known codecs: "
                         f"{', '.join(list_codecs())}")
    if FORMAT_KEY not in params:
        raise ValueError(f"codec {name!r} parameters lack {FORMAT_KEY!r} (payload format 1 "
                         f"had none; this build reads payload format {PAYLOAD_FORMAT})")
    fmt = params[FORMAT_KEY]
    if type(fmt) is not int or fmt != PAYLOAD_FORMAT:
        raise ValueError(f"{FORMAT_KEY}={fmt!r} is not supported: this build reads payload "
                         f"format {PAYLOAD_FORMAT}")
    given = {k: v for k, v in params.items() if k != FORMAT_KEY}
    expected = parameter_names(name)
    missing = sorted(expected - given.keys())
    if missing:
        raise ValueError(f"codec {name!r} parameters lack {', '.join(map(repr, missing))}: "
                         f"every parameter must be explicit (payload format {PAYLOAD_FORMAT})")
    unknown = sorted(given.keys() - expected)
    if unknown:
        raise ValueError(f"codec {name!r} has no parameter {', '.join(map(repr, unknown))}; "
                         f"its parameters: {', '.join(sorted(expected))}")
    return get_codec(name, **given)


def codec_name(codec_id: int) -> str:
    for name, cid in CODEC_IDS.items():
        if cid == codec_id:
            return name
    raise ValueError(f"unknown codec id {codec_id}; known ids: {sorted(CODEC_IDS.values())}")


def codec_from_wire(codec_id: int, params: dict) -> Codec:
    """Rebuild on the receiver the codec a frame header names (see ``codec_from_params``)."""
    return codec_from_params(codec_name(codec_id), params)
