"""argparse types shared by the ``lynx`` commands: values are checked when the command line is
parsed, before any work starts, and a bad one is a one-line error naming the option.

    parser.add_argument("--tokens", type=int_in(1, MAX_TOKENS), default=8192)
    parser.add_argument("--gbps", type=number_in(0, 1e5, low_open=True), default=1.0)
    parser.add_argument("--codec", type=names(list_codecs_lazily), default="bf16,int8")
    parser.add_argument("--json", type=output_file, metavar="OUT.json")

argparse reports a type's ``ArgumentTypeError`` as ``lynx CMD: error: argument --tokens: ...``;
``lynx_npu.cli`` prints it as one line and exits with 2.
"""
from __future__ import annotations

import argparse
import math
import os
import pathlib
from collections.abc import Callable, Iterable

MAX_TOKENS = 1 << 20


def _error(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An int in [low, high] (decimal digits, an optional sign)."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise _error(f"{text!r} is not an int") from None
        if not low <= value <= high:
            raise _error(f"{text!r} must be an int in [{low}, {high}]")
        return value
    parse.__name__ = f"int in [{low}, {high}]"
    return parse


def number_in(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    """A finite float in [low, high] ((low, high] with ``low_open``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _error(f"{text!r} is not a number") from None
        ok = math.isfinite(value) and (low < value if low_open else low <= value) \
            and value <= high
        if not ok:
            raise _error(f"{text!r} must be a finite number in "
                         f"{'(' if low_open else '['}{low:g}, {high:g}]")
        return value
    parse.__name__ = "number"
    return parse


def names(choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
          what: str = "name") -> Callable[[str], str]:
    """A comma-separated list of at least one name, none empty (``"a,,b"`` and ``","`` are
    errors), each one of ``choices`` (a sequence, or a function returning one, called at parse
    time so a command imports its registry only when it runs). Returns the text unchanged,
    so commands that split it themselves keep working."""
    def parse(text: str) -> str:
        items = [item.strip() for item in text.split(",")]
        if not text.strip() or any(not item for item in items):
            raise _error(f"{text!r} must be a comma-separated list of {what}s, none empty")
        if choices is not None:
            known = list(choices() if callable(choices) else choices)
            unknown = [item for item in items if item not in known]
            if unknown:
                raise _error(f"unknown {what}{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
        return text
    parse.__name__ = f"{what} list"
    return parse


def output_file(text: str) -> str:
    """A file path to write: not a directory, in a directory that exists and is writable
    (checked now, so a long run does not fail at its last step)."""
    if not text:
        raise _error("an output path must not be empty")
    path = pathlib.Path(text)
    if path.is_dir():
        raise _error(f"{text!r} is a directory; give a file path")
    parent = path.parent if str(path.parent) else pathlib.Path(".")
    if not parent.is_dir():
        raise _error(f"directory {str(parent)!r} of {text!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _error(f"directory {str(parent)!r} of {text!r} is not writable")
    return text


def optional_output_file(text: str) -> str:
    """``output_file``, or ``""`` for none."""
    return text if text == "" else output_file(text)


def existing_path(text: str) -> str:
    """A file or directory that exists."""
    if not text or not pathlib.Path(text).exists():
        raise _error(f"{text!r} does not exist")
    return text


def not_a_file(text: str) -> str:
    """A directory path that may not exist yet (it is created), but is not a file."""
    if not text or pathlib.Path(text).is_file():
        raise _error(f"{text!r} must be a directory path, not a file")
    return text


def layer_list(text: str) -> str:
    """Layer indices and ranges, e.g. ``0,3,10-12``: the syntax is checked here, the indices
    against the model's layer count once it is loaded."""
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a, b = int(lo, 10), int(hi, 10) if sep else int(lo, 10)
        except ValueError:
            raise _error(f"{text!r}: {part!r} is not a layer index or a range a-b") from None
        if a < 0 or b < a:
            raise _error(f"{text!r}: {part!r} must be an index >= 0 or a range a-b with a <= b")
    return text
