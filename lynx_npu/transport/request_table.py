"""The receiver's requests by id (plain Python plus the handles).

A request is *active* until it completes or fails, then *finished*. Only active requests take
one of ``max_requests`` slots, so requests that failed (refused frames, a passed deadline: an
abandoned request) or completed free theirs at once; finished ones are kept, up to
``max_finished``, for ``request()`` to return until they are released, the oldest forgotten
first. Ids released or forgotten are remembered a while so that late duplicates are
acknowledged instead of opening a new request.

Every request belongs to the sender that sent its first frame: its ``owner``, the session its
connection announced in the handshake and the peer's address. Frames of the id from any other
owner are refused and leave the request untouched, so a second sender (or a peer guessing
ids) cannot write into a transfer that another opened; so is an abort (``abort``: the owner
failed the request on its side and says so).

The table also counts each owner's live connections (``connected`` / ``disconnected``): a
request whose owner has had none for ``sender_grace_s`` fails (``fail_overdue``), since its
sender is gone (its prefill process died, or its host: then the receiver's idle timeout ends the
connection first). A live sender reconnects within a second (its backoff caps at 1 s) and
keeps its session, so its requests stand. Before, such a request waited out its deadline
(the vLLM connector's transfer_timeout_s, 600 s).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Hashable

from ..wire import Frame
from .errors import RemoteError, TransferDeadlineError, TransferError
from .receive_state import ReceiveHandle

log = logging.getLogger(__name__)

_RECENT = 4096  # released or forgotten ids remembered, so late duplicates are acknowledged


class RequestTable:
    def __init__(self, max_requests: int, max_finished: int, deadline_s: float):
        self.max_requests = max_requests
        self.max_finished = max_finished
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        self._active: dict[int, ReceiveHandle] = {}
        self._finished: collections.OrderedDict[int, ReceiveHandle] = collections.OrderedDict()
        self._recent: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._links: dict[Hashable, int] = {}      # owner -> its connections past the handshake
        self._lost: dict[Hashable, float] = {}     # owner -> when its last connection ended

    # -- the receiver's API ---------------------------------------------------------------------
    def claim(self, rid: int, deadline_s: float | None = None) -> ReceiveHandle:
        """``rid``'s handle, created now if no frame of it came (the local consumer asks:
        not bounded by max_requests; its deadline counts from now)."""
        with self._lock:
            handle = self._active.get(rid) or self._finished.get(rid)
            if handle is None:
                handle = self._open(rid, deadline_s)
            return handle

    def release(self, rid: int) -> ReceiveHandle | None:
        with self._lock:
            handle = self._active.pop(rid, None) or self._finished.pop(rid, None)
            self._remember(rid)
            return handle

    # -- frames ---------------------------------------------------------------------------------
    def for_frame(self, rid: int, owner: Hashable) -> tuple[ReceiveHandle | None, str | None]:
        """Where a data frame of ``rid`` from ``owner`` goes: (handle, None); (None, None) for
        a late duplicate of a released request (acknowledge it); (None, reason) if refused."""
        with self._lock:
            handle = self._active.get(rid) or self._finished.get(rid)
            if handle is None:
                if rid in self._recent:
                    return None, None
                if len(self._active) >= self.max_requests:
                    self._sweep()
                    if len(self._active) >= self.max_requests:
                        return None, (f"the receiver holds max_requests={self.max_requests} "
                                      f"requests in progress")
                handle = self._open(rid, None)
            if handle.owner is None:
                handle.owner = owner  # the first frame binds the request to its sender
            elif handle.owner != owner:
                return None, (f"request {rid} belongs to another sender session; frames of it "
                              f"from this one are refused")
            return handle, None

    def abort(self, frame: Frame, owner: Hashable) -> None:
        """An ERROR frame from a sender (frame format 5): it failed request ``rid`` on its
        side. Fail it here now, so that its reader learns at once instead of at its deadline.
        A request not seen yet is opened failed (its reader may claim it later); a completed
        one keeps its pages; one that ``owner`` does not own is left untouched."""
        rid, reason = frame.request_id, bytes(frame.payload).decode("utf-8", errors="replace")
        handle, refusal = self.for_frame(rid, owner)
        if handle is not None and not handle.finished:
            handle.fail(RemoteError(f"request {rid}: the sender failed it: {reason}"))
        if refusal:
            log.warning("request %d: ignoring an abort from a sender not its own: %s", rid,
                        refusal)
        else:
            log.info("request %d: the sender failed it: %s", rid, reason)

    # -- connections ----------------------------------------------------------------------------
    def connected(self, owner: Hashable) -> None:
        with self._lock:
            self._links[owner] = self._links.get(owner, 0) + 1
            self._lost.pop(owner, None)

    def disconnected(self, owner: Hashable, now: float) -> None:
        with self._lock:
            left = self._links.get(owner, 0) - 1
            if left > 0:
                self._links[owner] = left
            else:
                self._links.pop(owner, None)
                self._lost[owner] = now

    # -- upkeep (the watchdog) ------------------------------------------------------------------
    def fail_overdue(self, now: float, sender_grace_s: float) -> None:
        """Fail the requests past their deadline, and those whose sender has had no connection
        for ``sender_grace_s``; forget the lost senders that no request waits on."""
        with self._lock:
            waiting = [h for h in self._active.values() if not h.finished]
            expired = [h for h in waiting if now > h.deadline]
            orphaned = [(h, now - self._lost[h.owner]) for h in waiting
                        if now <= h.deadline and h.owner in self._lost
                        and now - self._lost[h.owner] > sender_grace_s]
            owners = {h.owner for h in waiting}
            for owner in [o for o in self._lost if o not in owners]:
                del self._lost[owner]
        for h in expired:  # abandoned: its slot is freed by the next sweep
            h.fail(TransferDeadlineError(f"request {h.request_id}: deadline passed after "
                                         f"{now - h.created_at:.2f} s ({h.progress()})"))
        for h, lost_s in orphaned:
            h.fail(TransferError(f"request {h.request_id}: its sender's connection ended "
                                 f"{lost_s:.1f} s ago and it has not come back "
                                 f"(sender_grace_s={sender_grace_s:g}; {h.progress()})"))

    def sweep(self) -> None:
        """Free the slots of requests that completed or failed."""
        with self._lock:
            self._sweep()

    def handles(self) -> list[ReceiveHandle]:
        with self._lock:
            return [*self._active.values(), *self._finished.values()]

    @property
    def num_active(self) -> int:
        with self._lock:
            return len(self._active)

    @property
    def num_finished(self) -> int:
        with self._lock:
            return len(self._finished)

    # -- internals (the caller holds _lock) -----------------------------------------------------
    def _open(self, rid: int, deadline_s: float | None) -> ReceiveHandle:
        handle = ReceiveHandle(rid, time.monotonic() + (deadline_s or self.deadline_s))
        self._active[rid] = handle
        self._recent.pop(rid, None)
        return handle

    def _sweep(self) -> None:
        for rid in [rid for rid, h in self._active.items() if h.finished]:
            self._finished[rid] = self._active.pop(rid)
        while len(self._finished) > self.max_finished:
            rid, _ = self._finished.popitem(last=False)
            self._remember(rid)

    def _remember(self, rid: int) -> None:
        self._recent[rid] = None
        while len(self._recent) > _RECENT:
            self._recent.popitem(last=False)
