"""Exploration (issue 19): does sending the prompt's last W tokens at full precision in the
anchor (their residual codes and exact chunk scalars moved from the residual stream to the
anchor stream; total bytes unchanged) or more exact sink tokens raise draft acceptance?
Results: docs/codec.md "Recent tokens and sinks in the anchor".

    python docs/experiments/recent_window_probe.py --windows 0,16,32,64 --sinks 32 \
        [every other option of lynx eval accept: --workloads, --prompts, --json, ...]

Runs ``lynx eval accept`` with the codecs replaced by these variants of the default ``lynx``
(reference codec): ``lynx`` (W = 0), ``lynx+rW`` (anchor = full-stage values for the last W
tokens of every layer), ``lynx:sinksN`` (``num_sink_tokens=N``, exact in the KV dtype).
Bits: ``lynx+rW``'s anchor is charged W x heads x head_dim x 2 (K, V) x 5 bits on top of the
default anchor's bytes (4 residual code bits + the exact float16 chunk scalars, 1 bit per value
at chunk 32), a slight undercount where a K chunk straddles the window's first token.
"""
from __future__ import annotations

import argparse
import math
import sys

import lynx_npu
from lynx_npu.eval import accept_cmd


class _Encoded:
    def __init__(self, inner, extra_anchor_bytes: int, anchor_stage: str):
        self.inner, self.extra, self.anchor_stage = inner, extra_anchor_bytes, anchor_stage

    def nbytes(self, stage: str) -> int:
        return self.inner.nbytes(stage) + (self.extra if stage == self.anchor_stage else 0)


class RecentExact:
    """``inner`` (a split codec) whose first stage also holds the last ``window`` tokens at
    its last stage's precision."""

    def __init__(self, inner, window: int):
        self.inner, self.window = inner, window
        self.name, self.stages = inner.name, inner.stages

    def params(self) -> dict:
        return {**self.inner.params(), "recent_exact_tokens": self.window}

    def encode(self, k, v):
        h, t, d = k.shape
        w = min(self.window, t)
        extra = math.ceil(w * h * d * 2 * 5 / 8)
        return _Encoded(self.inner.encode(k, v), extra, self.stages[0])

    def decode(self, enc: _Encoded, stage: str):
        k, v = self.inner.decode(enc.inner, stage=stage)
        if stage != self.stages[0] or self.window == 0:
            return k, v
        kf, vf = self.inner.decode(enc.inner, stage=self.stages[-1])
        k, v = k.clone(), v.clone()
        k[:, -self.window:] = kf[:, -self.window:]
        v[:, -self.window:] = vf[:, -self.window:]
        return k, v


class _Spec:
    """What ``lynx eval accept`` reads of a codec spec: a label and build()."""

    def __init__(self, label: str, make):
        self.label, self.build = label, make


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--windows", default="0,16,32,64")
    own.add_argument("--sinks", default="", help="comma-separated num_sink_tokens variants")
    mine, rest = own.parse_known_args()
    specs = []
    for w in (int(x) for x in mine.windows.split(",") if x):
        label = "lynx" if w == 0 else f"lynx+r{w}"
        specs.append(_Spec(label, lambda w=w: RecentExact(lynx_npu.get_codec("lynx"), w)))
    for n in (int(x) for x in mine.sinks.split(",") if x):
        specs.append(_Spec(f"lynx:sinks{n}",
                           lambda n=n: lynx_npu.get_codec("lynx", num_sink_tokens=n)))
    return run_accept(specs, rest, "recent_window_probe")


def run_accept(specs: list, argv: list[str], prog: str) -> int:
    """``lynx eval accept`` with ``argv``, its codecs replaced by ``specs``."""
    accept_cmd.select_codecs = lambda *_: specs
    parser = argparse.ArgumentParser(prog=prog)
    accept_cmd.add_arguments(parser)
    return accept_cmd.run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
