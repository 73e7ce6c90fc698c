"""Exploration (issue 19): does sending each chunk scalar once, at the precision the quantizer
uses (docs/experiments/scalar_once_probe.py), keep draft acceptance?  Results: docs/codec.md
"Scalars sent once", "Checked on 4096 tokens, Gemma 3 and acceptance".

    python docs/experiments/scalar_once_accept.py \\
        --variants "lynx,once8 C32/32 P256 half,once5/6 C32/32 P256 half" \\
        [every other option of lynx eval accept: --workloads, --prompts, --json, ...]

Runs ``lynx eval accept`` (as recent_window_probe.py does) with the codecs replaced by
``--variants``: ``lynx`` (the registry's default codec) and any label of scalar_once_probe's
``variants()`` (its own definitions, unchanged).  Drafts decode on the ``anchor`` stage, the
target is the ``full`` stage (and exact).  Bits are the probe's (page laid out like
lynx_layout.stream_layout, scalars packed at their widths).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import lynx_npu  # noqa: E402

import scalar_once_probe  # noqa: E402
from recent_window_probe import _Spec, run_accept  # noqa: E402


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--variants", default="lynx,once8 C32/32 P256 half")
    mine, rest = own.parse_known_args()
    probe = dict(scalar_once_probe.variants())
    specs = []
    for label in (x for x in mine.variants.split(",") if x):
        if label in probe:
            specs.append(_Spec(label, lambda label=label: dict(scalar_once_probe.variants())[label]))
        elif label in lynx_npu.list_codecs():
            specs.append(_Spec(label, lambda label=label: lynx_npu.get_codec(label)))
        else:
            raise SystemExit(f"unknown variant {label!r}; probe labels: {sorted(probe)}")
    return run_accept(specs, rest, "scalar_once_accept")


if __name__ == "__main__":
    sys.exit(main())
