"""Wait for log lines instead of polling: ``LogWaiter(text, count)`` is a logging handler whose
``event`` is set once ``count`` records whose message holds ``text`` have been logged."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["LogWaiter", "waiting_for"]


class LogWaiter(logging.Handler):
    """Sets :attr:`event` once ``count`` records whose message holds ``text`` were logged."""

    def __init__(self, text: str, count: int = 1) -> None:
        super().__init__(logging.DEBUG)
        self.text, self.count, self.seen = text, count, 0
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen += 1
            if self.seen >= self.count:
                self.event.set()


@contextmanager
def waiting_for(logger: str, text: str, count: int = 1) -> Iterator[LogWaiter]:
    """A :class:`LogWaiter` on ``logger`` for the ``with`` block (the logger must let the
    records through: set its level, e.g. with ``caplog.set_level``)."""
    waiter = LogWaiter(text, count)
    log = logging.getLogger(logger)
    log.addHandler(waiter)
    try:
        yield waiter
    finally:
        log.removeHandler(waiter)
