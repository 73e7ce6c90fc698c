"""Stopping a launched LMCache multiprocess server through its own shutdown path.

LMCache's server turns SIGINT (Python's default) and SIGTERM (its ``__main__`` maps it to
``default_int_handler``) into KeyboardInterrupt, then closes its server and engine ("MPCacheServer
closed"). A process started in the background of a non-interactive shell (``cmd &``, as a CI
rehearsal here was) inherits SIGINT ignored, and so does every process it starts: in two
rehearsals the server never saw the test's SIGINT (its /proc status: SigIgn 0x1001006,
SIGINT and SIGQUIT ignored, SIGTERM caught) and was still up 120 s later. So SIGINT goes first
and SIGTERM follows if it did not act, both through LMCache's own shutdown, and only then is
the process killed (which the callers' ``rc == 0`` checks report).
"""
from __future__ import annotations

import signal
import subprocess

SIGNAL_WAIT_S = 60  # per signal; idle, the shutdown takes a few seconds


def stop_server(proc: subprocess.Popen, wait_s: float = SIGNAL_WAIT_S) -> int:
    """SIGINT, then SIGTERM, each given ``wait_s``; then SIGKILL. -> the exit status."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        try:
            return proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
    if proc.poll() is None:
        proc.kill()
    return proc.wait()
