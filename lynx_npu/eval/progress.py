"""Progress on stderr: a tqdm bar when tqdm is installed, else one line per step."""
from __future__ import annotations

import contextlib
import sys
import time

_ENABLED = True


def set_enabled(enabled: bool) -> None:
    """Turn progress output on or off for this process (``--quiet``)."""
    global _ENABLED
    _ENABLED = enabled


class _Lines:
    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.n, self.t0 = total, desc, 0, time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        print(f"{self.desc} {self.n}/{self.total} ({time.perf_counter() - self.t0:.1f} s)",
              file=sys.stderr, flush=True)


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


@contextlib.contextmanager
def muted():
    """No progress bars inside (a step of a command that logs its own progress)."""
    global _ENABLED
    before, _ENABLED = _ENABLED, False
    try:
        yield
    finally:
        _ENABLED = before


@contextlib.contextmanager
def progress(total: int, desc: str):
    """``with progress(n, "lynx: layer") as bar: ... bar.update()``"""
    if not _ENABLED:
        yield _Silent()
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield _Lines(total, desc)
        return
    with tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        yield bar


def log(message: str) -> None:
    if _ENABLED:
        print(message, file=sys.stderr, flush=True)
