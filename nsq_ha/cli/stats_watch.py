"""``nsq-ha stats --watch``: where each refresh goes, and each partition's msgs/s.

On a terminal the table is redrawn in place: rich's ``Live`` when rich is installed (and not
``--plain``), else plain text that moves the cursor back up over the last table and clears to
the end of the screen (ANSI). Through a pipe or into a file each refresh is printed after the
last one, a table and a blank line (``--json``: one object per line, wherever stdout goes), so
logs stay readable. :class:`Rates` turns the partitions' ``message_count`` into msgs/s: the growth
since the last refresh over the time between the two (None in the first table).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, Protocol, TextIO

from .output import have_rich, print_table, rich_table, table_lines

__all__ = ["Display", "Rates", "display_for"]


class Rates:
    """msgs/s of each partition (vanilla: each nsqd's topic) between two refreshes."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[int, float]] = {}

    def apply(
        self, counts: Sequence[tuple[Hashable, int | None]], now: float
    ) -> list[float | None]:
        """The msgs/s of each (key, message count) since the counts of the last call (at
        monotonic ``now``); None for a key first seen, or whose count went down (re-created)."""
        seen: dict[Hashable, tuple[int, float]] = {}
        rates: list[float | None] = []
        for key, messages in counts:
            rate = None
            if messages is not None:
                seen[key] = (messages, now)
                last = self._last.get(key)
                if last is not None and now > last[1] and messages >= last[0]:
                    rate = round((messages - last[0]) / (now - last[1]), 1)
            rates.append(rate)
        self._last = seen
        return rates


class Display(Protocol):
    """Where the tables of ``--watch`` go."""

    def show(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        """Show one refresh (``rows`` empty: the title alone)."""

    def close(self) -> None:
        """Leave the last table on the screen."""


class _Appended:
    """Each table after the last, and a blank line (a pipe, a file, a log)."""

    def __init__(self, out: TextIO, plain: bool) -> None:
        self._out = out
        self._plain = plain

    def show(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        if rows:
            print_table(title, columns, rows, stream=self._out, plain=self._plain)
        else:
            print(title, file=self._out)
        print(file=self._out, flush=True)

    def close(self) -> None:
        """Nothing to restore."""


class _Redrawn:
    """Plain text on a terminal: back up over the last table, clear, draw the new one."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._height = 0

    def show(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        lines = table_lines(title, columns, rows) if rows else [title]
        width = max(1, shutil.get_terminal_size().columns)
        back = f"\x1b[{self._height}A\r\x1b[J" if self._height else ""
        self._out.write(back + "".join(line + "\n" for line in lines))
        self._out.flush()
        self._height = sum(max(1, -(-len(line) // width)) for line in lines)

    def close(self) -> None:
        """The table stays; the cursor is below it."""


class _Live:
    """rich's ``Live`` on a terminal."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self._live: Any = Live(console=Console(file=out), auto_refresh=False)
        self._live.start()

    def show(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        from rich.text import Text

        shown = rich_table(title, columns, rows) if rows else Text(title)
        self._live.update(shown, refresh=True)

    def close(self) -> None:
        self._live.stop()


@contextlib.contextmanager
def display_for(*, plain: bool, out: TextIO | None = None) -> Iterator[Display]:
    """The display of the tables of ``--watch`` on ``out`` (stdout), closed at the end."""
    stream = out or sys.stdout
    display: Display
    if not stream.isatty():
        display = _Appended(stream, plain)
    elif not plain and have_rich():
        display = _Live(stream)
    else:
        display = _Redrawn(stream)
    try:
        yield display
    finally:
        display.close()
