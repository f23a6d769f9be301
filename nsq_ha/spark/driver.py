"""The driver source's Spark class (vanilla NSQ, or ``mode=driver``): one consumer on the
driver, its state in :class:`.source.DriverReader`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import SimpleDataSourceStreamReader

from ..errors import ConfigError
from .options import ReadOptions
from .source import DriverReader

__all__ = ["NsqDriverReader"]


class NsqDriverReader(SimpleDataSourceStreamReader):
    """The at-least-once source (vanilla, or ``mode=driver``): see :class:`.source.DriverReader`.

    Offsets are batch numbers ``{"seq": n}``; the state lives in the driver's source process.
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._state: DriverReader | None = None

    def _reader(self) -> DriverReader:
        if self._state is None:
            if self.opts.channel is None:
                raise ConfigError("mode=driver needs the option 'channel'")
            self._state = DriverReader(self.opts, self.opts.channel)
        return self._state

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_state": None}

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0}

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, Any]]:
        seq = int(start["seq"]) + 1
        rows = self._reader().read(seq)
        if not rows:
            return iter(()), start
        return iter(rows), {"seq": seq}

    def readBetweenOffsets(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> Iterator[tuple[Any, ...]]:
        return self._reader().replay(int(start["seq"]) + 1, int(end["seq"]))

    def commit(self, end: dict[str, Any]) -> None:
        self._reader().commit(int(end["seq"]))
