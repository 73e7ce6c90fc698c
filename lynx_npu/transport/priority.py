"""CPU priority of the transport's own threads (Linux).

A decode instance drafts on the anchor while the residual streams in: every frame wakes the
receiver's reader and the pacer of a sender on the same host, and on a host whose cores the
model threads already fill (vLLM's engine core waits by spinning), each wake-up can delay the
forward pass it preempts. Lowering the transport threads' priority keeps the model threads
first: a nice-10 thread still gets CPU whenever it is free and ~10% of a contended core
(docs/demo.md, "Transport threads at nice 10").
"""
from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)


def check_nice(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 19:
        raise ValueError(f"{name}={value!r} must be an int in [0, 19] (the least nice value of "
                         "the transport's threads; 0 leaves them as they are)")


def lower_this_thread(nice: int) -> None:
    """Raise the calling thread's nice value to at least ``nice`` (Linux; a no-op elsewhere,
    where setpriority names a process, not a thread)."""
    if not nice or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as e:  # a sandbox without setpriority: run at the inherited priority
        log.debug("could not lower the priority of thread %d: %s", tid, e)
