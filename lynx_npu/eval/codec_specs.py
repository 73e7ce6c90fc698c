"""Codec selections from the command line.

A codec spec is ``name`` or ``name:key=value:key=value`` (e.g. ``lynx:preset=paper``).
``--codec-arg name:key=value`` (repeatable) adds an override to every selected spec of that
codec name (a value written in the spec itself wins). A spec's label in reports is its name
and every override, in the same syntax. Values parse as int, float, bool
(true/false), None (none) or a JSON list (``[...]``, e.g. ``--codec-arg
'lynx:layer_anchor_bits=[[18,5,4],[23,5,4]]'``; in ``--codec-arg`` only, since specs are
comma separated), else stay strings.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CodecSpec:
    name: str
    overrides: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return ":".join([self.name] + [f"{k}={v}" for k, v in self.overrides.items()])

    def build(self):
        import lynx_npu

        return lynx_npu.get_codec(self.name, **self.overrides)


def parse_value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    if low.startswith("["):
        import json
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{text!r} is not a JSON list: {e}") from None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_pairs(items: list[str], where: str) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{where}: {item!r} must look like key=value")
        out[key.strip()] = parse_value(value.strip())
    return out


def parse_codec_spec(spec: str) -> CodecSpec:
    parts = spec.strip().split(":")
    if not parts[0]:
        raise ValueError(f"codec spec {spec!r} has no codec name")
    return CodecSpec(parts[0], parse_pairs(parts[1:], f"codec spec {spec!r}"))


def parse_codec_arg(arg: str) -> tuple[str, str, object]:
    """``"lynx:alpha_k=3"`` -> ``("lynx", "alpha_k", 3)``."""
    name, sep, rest = arg.partition(":")
    if not sep or not name:
        raise ValueError(f"--codec-arg {arg!r} must look like codec:key=value (e.g. lynx:alpha_k=3)")
    ((key, value),) = parse_pairs([rest], f"--codec-arg {arg!r}").items()
    return name, key, value


def select_codecs(codecs: str | None, codec_args: list[str] | None,
                  available: list[str]) -> list[CodecSpec]:
    """The specs to evaluate: ``codecs`` (comma-separated specs) or every available codec,
    with the ``--codec-arg`` overrides applied. Unknown codec names raise ValueError."""
    specs = ([parse_codec_spec(s) for s in codecs.split(",") if s.strip()] if codecs
             else [CodecSpec(name) for name in available])
    if not specs:
        raise ValueError(f"--codecs {codecs!r} selects no codec")
    for s in specs:
        if s.name not in available:
            raise ValueError(f"unknown codec {s.name!r}; available: {', '.join(available)}")
    for arg in codec_args or []:
        name, key, value = parse_codec_arg(arg)
        targets = [s for s in specs if s.name == name]
        if not targets:
            raise ValueError(f"--codec-arg {arg!r} names codec {name!r}, which is not selected")
        for s in targets:
            s.overrides.setdefault(key, value)
    return specs
