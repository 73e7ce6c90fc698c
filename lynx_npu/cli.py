"""The ``lynx`` console command.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their command runs, so ``lynx --help``
stays fast and a missing optional dependency only breaks the command that needs it.

Errors are one line on stderr and a non-zero exit, never a traceback: a bad argument is
refused when the command line is parsed (the types of lynx_npu/cli_types.py; exit 2); a
``ValueError`` (this package's user errors name the value), an unavailable backend, an
``OSError`` or Ctrl-C during the run exits 1 (130 for Ctrl-C) with its message.
``LYNX_DEBUG=1`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import importlib
import os
import sys

# (group, command) -> (module, one-line help). A group of None is a top-level command.
COMMANDS: dict[tuple[str | None, str], tuple[str, str]] = {
    ("eval", "codecs"): ("lynx_npu.eval.codecs_cmd", "codec error on real KV of a real model"),
    ("eval", "sweep"): ("lynx_npu.eval.sweep_cmd", "alpha / V-axis / sink sweep with a PNG plot"),
    ("eval", "accept"): ("lynx_npu.eval.accept_cmd", "drafts accepted per codec on real prompts"),
    ("eval", "quality"): ("lynx_npu.eval.quality_cmd", "ppl, needle, QMSum, MMLU-Pro per codec"),
    ("bench", "kernels"): ("lynx_npu.eval.bench_kernels", "compress/decompress GB/s per backend"),
    ("bench", "transfer"): ("lynx_npu.transport.bench_cmd", "split-stream transfer over loopback"),
    ("bench", "datapath"): ("lynx_npu.eval.bench_datapath",
                            "paged cache -> compress -> loopback TCP -> decompress into a cache"),
    ("bench", "ttkt"): ("lynx_npu.integration.vllm_ascend.tools.ttkt_sweep",
                        "TTFT/TT64 of lynx vs int8 across prompt lengths and link rates"),
    (None, "calibrate"): ("lynx_npu.eval.calibrate_cmd",
                          "a model's Lynx plan: wider anchors and larger V chunks by layer (lynx_plan)"),
    (None, "demo"): ("lynx_npu.integration.vllm_ascend.tools.demo",
                     "prefill + decode vLLM instances with Lynx KV transfer"),
}


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (usage is one ``--help`` away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def _build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = _Parser(prog="lynx", description=__doc__.splitlines()[0], add_help=add_help)
    top = parser.add_subparsers(dest="group", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for (group, name), (module, help_) in COMMANDS.items():
        if group is None:
            sub = top.add_parser(name, help=help_, add_help=add_help)
        else:
            if group not in groups:
                groups[group] = top.add_parser(group, help=f"{group} commands",
                                               add_help=add_help).add_subparsers(
                    dest="command", required=True)
            sub = groups[group].add_parser(name, help=help_, add_help=add_help)
        sub.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Parse once without -h to find the module, then let it add its own arguments and parse
    # again, so `lynx bench transfer --help` lists that command's options.
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the second parse reports errors
            known, _ = _build_parser(add_help=False).parse_known_args(argv)
    except SystemExit:
        known = None
    if known is None or not hasattr(known, "_module"):
        return int(_build_parser().parse_args(argv) or 0)  # prints usage / help and exits
    module = importlib.import_module(known._module)
    sub = _build_parser()
    for action in sub._subparsers._group_actions:  # find the chosen leaf parser
        leaf = action.choices[known.group]
        if getattr(known, "command", None):
            leaf = leaf._subparsers._group_actions[0].choices[known.command]
        module.add_arguments(leaf)
    args = sub.parse_args(argv)
    prog = " ".join(["lynx", known.group] + ([known.command] if getattr(known, "command", None)
                                             else []))
    if os.environ.get("LYNX_DEBUG") == "1":
        return int(module.run(args) or 0)
    from lynx_npu.ops.backends import BackendUnavailable
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, BackendUnavailable, OSError) as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
