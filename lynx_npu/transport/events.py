"""StageEvent: a one-shot event that either succeeds or fails, for threads and asyncio.

``is_set()`` / ``wait(timeout)`` behave like threading.Event (so a decode loop can poll
``residual_ready.is_set()`` between steps), except that ``wait`` raises the request's error
once it has failed: a waiter is woken by a failure, never left hanging. ``await event``
does the same from asyncio.
"""
from __future__ import annotations

import asyncio
import threading


class StageEvent:
    def __init__(self, name: str):
        self.name = name
        self._cond = threading.Condition()
        self._ok = False
        self._error: BaseException | None = None
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def is_set(self) -> bool:
        return self._ok

    @property
    def error(self) -> BaseException | None:
        return self._error

    def settled(self) -> bool:
        return self._ok or self._error is not None

    def set(self) -> None:
        self._settle(None)

    def fail(self, error: BaseException) -> None:
        """Fail the event unless it has already succeeded."""
        self._settle(error)

    def _settle(self, error: BaseException | None) -> None:
        with self._cond:
            if self.settled():
                return
            if error is None:
                self._ok = True
            else:
                self._error = error
            self._cond.notify_all()
            futures, self._futures = self._futures, []
        for loop, fut in futures:
            try:
                loop.call_soon_threadsafe(_resolve, fut, error)
            except RuntimeError:  # the loop was closed: nobody is waiting any more
                pass

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False if ``timeout`` passed first; raises if the event failed."""
        with self._cond:
            self._cond.wait_for(self.settled, timeout)
        if self._error is not None:
            raise self._error
        return self._ok

    async def wait_async(self) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._cond:
            if not self.settled():
                self._futures.append((loop, fut))
        if self.settled():
            _resolve(fut, self._error)
        await fut

    def __await__(self):
        return self.wait_async().__await__()

    def __repr__(self) -> str:
        state = "set" if self._ok else ("failed" if self._error else "pending")
        return f"StageEvent({self.name!r}, {state})"


def _resolve(fut: asyncio.Future, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)
