"""The machinery under :mod:`nsq_ha.sync`: the shared event loop thread and the exit flush.

A forked child has no copy of the loop thread: right after ``fork`` the child marks its
inherited :class:`LoopThread` stale and starts a new one on first use. Objects bound to a stale
loop re-create what they need in the child, or refuse at once (never wait for it).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, Self, TypeVar

from nsq_ha.errors import NsqTimeoutError

log = logging.getLogger("nsq_ha.sync")

_T = TypeVar("_T")
_P = ParamSpec("_P")

#: extra seconds a blocking ``close()`` waits beyond the limits it was given, against a layer
#: below that would never finish (it raises NsqTimeoutError then)
CLOSE_BACKSTOP = 30.0


class _ExitSafeExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor (it resolves host names): at exit, when it takes no new work
    but the exit flush may still resolve a host, the call runs inline on the loop thread."""

    def submit(
        self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> concurrent.futures.Future[_T]:
        try:
            return super().submit(fn, *args, **kwargs)
        except RuntimeError:  # shut down (at exit): no worker thread may start now
            future: concurrent.futures.Future[_T] = concurrent.futures.Future()
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to the awaiting coroutine
                future.set_exception(exc)
            return future


class LoopThread:
    """An event loop running forever in a daemon thread, in the process that started it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(_ExitSafeExecutor(thread_name_prefix="nsq_ha-sync"))
        self.pid = os.getpid()
        #: in a forked child, or once the thread was found dead: nothing submitted would run
        self.stale = False
        self.thread = threading.Thread(target=self._run, name="nsq_ha-sync-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        while True:
            try:
                self.loop.run_forever()
                return  # stopped on purpose
            except (SystemExit, KeyboardInterrupt) as exc:  # asyncio lets only these out
                # user code on the loop (a callback, on_give_up) raised it: stopping here
                # would leave every blocking call of the process waiting for nothing
                log.error(
                    "%s raised on the nsq_ha.sync event loop thread (by code run there, such "
                    "as a callback): the loop keeps running; stop the program from the main "
                    "thread instead",
                    type(exc).__name__,
                    exc_info=exc,
                )

    @property
    def alive_here(self) -> bool:
        """False in a forked child of the process that started it, or once the thread ended."""
        return not self.stale and self.pid == os.getpid() and self.thread.is_alive()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError(
                "nsq_ha.sync called from its own event loop thread: use the async API there"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        return self.wait(self.submit(coro), timeout)

    @staticmethod
    def wait(future: concurrent.futures.Future[_T], timeout: float | None) -> _T:
        """The future's result; after ``timeout`` seconds it is cancelled: NsqTimeoutError."""
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise NsqTimeoutError(
                f"no result within {timeout} s (the operation was cancelled)"
            ) from exc


_lock = threading.Lock()
_shared: LoopThread | None = None


def loop_thread() -> LoopThread:
    """This process's loop thread, started on first use (and again in a forked child)."""
    global _shared
    with _lock:
        if _shared is None or not _shared.alive_here:
            if _shared is not None:
                _shared.stale = True
            _shared = LoopThread()
            # multiprocessing ends its children with os._exit (no atexit hooks) after running its
            # finalizers: flush there too (in the main process, a harmless second exit flush)
            util = sys.modules.get("multiprocessing.util")
            if util is not None:
                util.Finalize(None, close_all_at_exit, exitpriority=0)
        return _shared


# -- closing, and the exit flush ---------------------------------------------------------------

#: a started close: its future and the most seconds to wait for it (None: nothing to close here)
Begun = tuple[concurrent.futures.Future[None], float] | None


class Closable:
    """A blocking object: ``with`` closes it, and the exit hook does if the program did not."""

    def _start_close(self, limit: float | None = None) -> Begun:
        """Start closing, within ``limit`` seconds (None: the object's own limit)."""
        raise NotImplementedError

    def _close(self, limit: float | None) -> None:
        begun = self._start_close(limit)
        if begun is not None:
            LoopThread.wait(*begun)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._close(None)  # what close() does without a limit


_registry_lock = threading.Lock()
#: every blocking object not closed yet, held strongly so that one dropped is flushed at exit
_open: dict[Closable, None] = {}
#: guards re-creating an object's asyncio twin in a forked child
rebind_lock = threading.Lock()


def register(obj: Closable) -> None:
    with _registry_lock:
        _open[obj] = None


def unregister(obj: Closable) -> None:
    with _registry_lock:
        _open.pop(obj, None)


@atexit.register
def close_all_at_exit() -> None:
    """At exit, close every blocking object still open, at once, each within its deadline."""
    with _registry_lock:
        objects = list(_open)
    started = time.monotonic()
    closing: list[tuple[Closable, concurrent.futures.Future[None], float]] = []
    for obj in objects:
        try:
            begun = obj._start_close()
        except Exception as exc:
            log.warning("exit: could not close %r: %r", obj, exc)
            continue
        if begun is not None:
            closing.append((obj, *begun))
    for obj, future, limit in closing:
        left = min(max(0.0, started + limit - time.monotonic()), threading.TIMEOUT_MAX)
        try:
            future.result(left)
        except concurrent.futures.TimeoutError:
            future.cancel()
            log.warning("exit: %r did not close within %.1f s", obj, limit)
        except Exception as exc:
            log.warning("exit: closing %r failed: %r", obj, exc)


def _after_fork_in_child() -> None:
    """In a forked child: the loop thread (and whatever lock a parent thread held) is not here."""
    global _lock, _registry_lock, rebind_lock
    _lock = threading.Lock()
    _registry_lock = threading.Lock()
    rebind_lock = threading.Lock()
    if _shared is not None:
        _shared.stale = True


os.register_at_fork(after_in_child=_after_fork_in_child)
