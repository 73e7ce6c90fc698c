"""LMCache's multiprocess server with the Lynx serde registered.

    python -m lynx_npu.integration.lmcache.server [LMCache server args] \
        --lynx-codec lynx --lynx-head-dim 64 [--lynx-stage full] [--lynx-max-workers 1] \
        [--lynx-kv-layout vllm_cpu_vec --lynx-block-size 128]

LMCache has no plugin discovery: a serde must be registered in the server's own process before
the server parses its L2 adapters. This imports the factory (registering ``"lynx"``), then runs
``lmcache.v1.multiprocess.server`` as ``__main__`` with the remaining arguments, so its options
and behaviour are LMCache's own. With ``--lynx-codec``, every ``--l2-adapter`` JSON that names
no serde gets ``{"type": "lynx", ...}`` from the ``--lynx-*`` options; without it, name the serde
in the adapter JSON yourself (``"serde": {"type": "lynx", "head_dim": 64, ...}``);
``"serde": null`` keeps an adapter raw. A bad ``--lynx-*`` option or adapter JSON is one line
on stderr and exit status 2, before LMCache starts.
"""
from __future__ import annotations

import argparse
import json
import runpy
import sys

SERVER_MODULE = "lmcache.v1.multiprocess.server"
PROG = "python -m lynx_npu.integration.lmcache.server"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, add_help=False, allow_abbrev=False,
        description="LMCache's multiprocess server with the Lynx L2 serde registered; every "
                    "other argument goes to lmcache.v1.multiprocess.server")
    p.add_argument("--lynx-codec", default=None,
                   help="lynx (anchor + residual), lynx-int4 (anchor only) or lynx-int8 (one "
                        "full stream): put the Lynx serde on every --l2-adapter naming none")
    p.add_argument("--lynx-head-dim", type=int, default=None,
                   help="the model's head_dim (required with --lynx-codec)")
    p.add_argument("--lynx-stage", default=None,
                   help="stage stored and loaded (default: the codec's last; lynx: anchor "
                        "stores the anchor stream only)")
    p.add_argument("--lynx-kv-layout", default=None,
                   help="how LMCache's objects hold K and V: split (default; GPU engines) or "
                        "vllm_cpu_vec (vLLM-CPU's cache, x86 float32)")
    p.add_argument("--lynx-block-size", type=int, default=None,
                   help="the engine's KV block size (vllm_cpu_vec; default 128)")
    p.add_argument("--lynx-max-workers", type=int, default=None, help="serde threads (1)")
    return p


LYNX_OPTIONS = ("lynx_head_dim", "lynx_stage", "lynx_kv_layout", "lynx_block_size",
                "lynx_max_workers")


def serde_entry(args: argparse.Namespace) -> dict:
    """The ``"serde"`` JSON of the --lynx-* options, checked as the server will check it."""
    from .serde import SERDE_NAME, LynxSerdeConfig

    if args.lynx_head_dim is None:
        raise ValueError("--lynx-codec needs --lynx-head-dim (the model's head_dim)")
    entry = {"type": SERDE_NAME, "codec": args.lynx_codec, "head_dim": args.lynx_head_dim}
    for opt in LYNX_OPTIONS[1:]:
        if getattr(args, opt) is not None:
            entry[opt[len("lynx_"):]] = getattr(args, opt)
    LynxSerdeConfig.from_kwargs({k: v for k, v in entry.items() if k != "type"})
    return entry


def with_serde(argv: list[str], entry: dict) -> list[str]:
    """``argv`` with ``entry`` as the serde of every --l2-adapter JSON that names none
    (``"serde": null`` keeps an adapter raw)."""
    out, i, adapters = [], 0, 0
    while i < len(argv):
        arg = argv[i]
        value = None
        if arg == "--l2-adapter" and i + 1 < len(argv):
            value, i = argv[i + 1], i + 1
        elif arg.startswith("--l2-adapter="):
            arg, value = arg.split("=", 1)
        if value is not None:
            adapters += 1
            try:
                spec = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"--l2-adapter is not JSON ({e}): {value!r}") from None
            if isinstance(spec, dict) and "serde" not in spec:
                spec["serde"] = entry
            out += [arg, json.dumps(spec)]
        else:
            out.append(arg)
        i += 1
    if not adapters:
        raise ValueError("--lynx-codec given but no --l2-adapter to put the serde on")
    return out


def fail(message: str) -> None:
    """One line on stderr, exit status 2 (as argparse's errors)."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        _parser().print_help()
        print("\nLMCache's own options follow.\n")
    args, rest = _parser().parse_known_args(argv)
    if args.lynx_codec is not None:
        try:
            rest = with_serde(rest, serde_entry(args))
        except ValueError as e:
            fail(" ".join(str(e).split()))
    else:
        given = [o for o in LYNX_OPTIONS if getattr(args, o) is not None]
        if given:
            fail(f"--{given[0].replace('_', '-')} needs --lynx-codec (or name the serde in "
                 f"the --l2-adapter JSON)")
    from . import factory  # noqa: F401  registers "lynx" in this process

    sys.argv = [SERVER_MODULE] + rest
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
