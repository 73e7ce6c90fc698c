"""Exploration (issue 15): what do fewer bits of scalar preview cost the anchor?

The anchor carries one byte per chunk scalar (mu, sigma: 0.5 bits per value at chunk 32,
lynx_stream.py); lynx's TTFT sits ~4% over INT4's because the anchor is 4.66 against 4.5 bits
(docs/demo.md). This probe swaps lynx_stream's ``preview`` / ``expand`` for coarser grids and runs
``lynx eval codecs`` on the default ``lynx`` codec: only the anchor-stage reconstruction changes
(codes are computed against the exact scalars, so the full stage is untouched). The bytes on the
wire do not change in the probe; a ``b_mu + b_sigma``-bit preview would save
``(16 - b_mu - b_sigma) / 32`` bits per value. Results: docs/codec.md "A smaller anchor for TTFT".

    python docs/experiments/preview_bits_probe.py --variant m7s7 --tokens 4096 --json OUT.json

Variants: ``m{b_mu}s{b_sigma}``; mu linear on [0, 1] (2^b_mu levels), sigma 0 or geometric on
[2^lo, 2^-1] (2^b_sigma - 1 levels; the midrange centre's sigma is at most 1/2); ``lo`` from
``--sigma-lo`` (default -7). ``today`` keeps the committed 8 + 8-bit previews.
"""
from __future__ import annotations

import argparse
import re
import sys

import torch

import lynx_npu.codec.lynx_stream as stream


def grids(mu_bits: int, sigma_bits: int, lo: float, hi: float = -1.0):
    """-> (preview, expand) with lynx_stream's signatures on the given grids."""
    nm, ns = 2 ** mu_bits - 1, 2 ** sigma_bits - 2

    def level(us: torch.Tensor) -> torch.Tensor:
        return torch.where(us > 0, torch.exp2(lo + (us - 1) * (hi - lo) / ns), 0.0)

    def preview(stats: torch.Tensor) -> torch.Tensor:
        s = stats.float()
        mu, sigma = s[..., 0, :], s[..., 1, :]
        steps = (torch.log2(sigma.clamp_min(2.0 ** lo)) - lo) * (ns / (hi - lo))
        us = torch.where(sigma > 0, 1 + torch.round(steps).clamp(0, ns), 0)
        um = torch.round(mu.clamp(0, 1) * nm)
        return torch.stack([um, us], dim=-2).to(torch.uint8)

    def expand(previews: torch.Tensor) -> torch.Tensor:
        p = previews.float()
        return torch.stack([p[..., 0, :] / nm, level(p[..., 1, :])],
                           dim=-2).to(stream.SCALAR_DTYPE)

    return preview, expand


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="today")
    parser.add_argument("--sigma-lo", type=float, default=-7.0)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", default="4096")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.variant != "today":
        m = re.fullmatch(r"m(\d)s(\d)", args.variant)
        if not m:
            parser.error(f"--variant {args.variant!r}: want 'today' or m<bits>s<bits>")
        stream.preview, stream.expand = grids(int(m[1]), int(m[2]), args.sigma_lo)
    from lynx_npu.cli import main as cli
    argv = ["eval", "codecs", "--quiet", "--model", args.model, "--tokens", args.tokens,
            "--codecs", "lynx"] + (["--json", args.json] if args.json else [])
    return cli(argv)


if __name__ == "__main__":
    sys.exit(main())
