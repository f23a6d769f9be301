"""Tables and progress for the command line: ``rich`` when installed (``nsq-ha[cli]``), plain
aligned text otherwise, so the client itself does not depend on a terminal library."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self, TextIO

__all__ = ["Progress", "have_rich", "print_table", "rich_table", "table_lines"]


def have_rich() -> bool:
    """True when ``rich`` can be imported."""
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _numeric(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[bool]:
    return [
        all(isinstance(row[i], int | float) or row[i] is None for row in rows) and bool(rows)
        for i in range(len(columns))
    ]


def _cells(rows: Sequence[Sequence[object]]) -> list[list[str]]:
    return [["" if c is None else str(c) for c in row] for row in rows]


def rich_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> Any:
    """``rows`` as a ``rich`` Table (rich must be installed: :func:`have_rich`)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for name, right in zip(columns, _numeric(columns, rows), strict=True):
        table.add_column(name, justify="right" if right else "left")
    for row in _cells(rows):
        table.add_row(*row)
    return table


def table_lines(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """``rows`` as plain aligned text: the title, the header, a rule, a line per row."""
    cells = _cells(rows)
    numeric = _numeric(columns, rows)
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if right else v.ljust(w)
            for v, w, right in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return [title, line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)]


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    stream: TextIO | None = None,
    plain: bool = False,
) -> None:
    """Print ``rows`` under ``columns``; numbers are right-aligned."""
    out = stream or sys.stdout
    if not plain and have_rich():
        from rich.console import Console

        # off a terminal rich assumes 80 columns; let the table take the width it needs
        Console(file=out, width=None if out.isatty() else 200).print(
            rich_table(title, columns, rows)
        )
        return
    for text in table_lines(title, columns, rows):
        print(text, file=out)


class Progress:
    """Named counters with totals, shown as bars (rich, on a terminal) or as a line per 10%."""

    def __init__(self, stream: TextIO | None = None, *, plain: bool = False) -> None:
        self._out = stream or sys.stderr
        self._totals: dict[str, int] = {}
        self._done: dict[str, int] = {}
        self._shown: dict[str, int] = {}
        self._rich: Any = None
        self._ids: dict[str, Any] = {}
        self._started = time.monotonic()
        if not plain and have_rich() and self._out.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(
                TextColumn("{task.description:<22}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self._out),
            )

    def __enter__(self) -> Self:
        if self._rich is not None:
            self._rich.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._rich is not None:
            self._rich.stop()

    def add(self, name: str, total: int) -> None:
        """Start a counter ``name`` that completes at ``total``."""
        self._totals[name] = total
        self._done[name] = 0
        self._shown[name] = -1
        if self._rich is not None:
            self._ids[name] = self._rich.add_task(name, total=total)

    def advance(self, name: str, count: int = 1) -> None:
        """Count ``count`` more of ``name``."""
        self._done[name] += count
        if self._rich is not None:
            self._rich.update(self._ids[name], completed=self._done[name])
            return
        total = self._totals[name] or 1
        decile = min(10, self._done[name] * 10 // total)
        if decile > self._shown[name]:
            self._shown[name] = decile
            elapsed = time.monotonic() - self._started
            print(
                f"{name:<22} {self._done[name]:>6}/{self._totals[name]} "
                f"({decile * 10:>3}%) {elapsed:6.1f}s",
                file=self._out,
                flush=True,
            )

    def note(self, text: str) -> None:
        """Print a line between the bars."""
        if self._rich is not None:
            self._rich.console.print(text)
        else:
            print(text, file=self._out, flush=True)
