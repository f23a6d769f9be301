"""Which PySpark this is, and what each part of the ``nsq`` data source needs of it.

===========================================  =====  ============================================
part                                         needs  the Python Data Source API it uses
===========================================  =====  ============================================
batch reads (``spark.read``)                 4.0    ``DataSourceReader``, Arrow batches from
                                                    ``read()``
batch writes (``df.write``)                  4.0    ``DataSourceWriter``
streaming writes (``df.writeStream``)        4.0    ``DataSourceStreamWriter``
streaming reads, ``mode=driver``             4.0    ``SimpleDataSourceStreamReader``
``mode=driver`` stopped with its query,      4.2    ``DataSourceStreamReader`` with
``Trigger.AvailableNow`` in ``mode=driver``         ``latestOffset(start, limit)``, ``stop()``,
                                                    ``SupportsTriggerAvailableNow``
streaming reads, replayable                  4.2    admission control: ``latestOffset(start,
                                                    limit)``, ``getDefaultReadLimit()``,
                                                    ``ReadMaxBytes``, ``reportLatestOffset()``,
                                                    ``SupportsTriggerAvailableNow``
===========================================  =====  ============================================

What a running PySpark lacks fails with :class:`SparkVersionError`, naming both versions. Before
4.2 the names of ``pyspark.sql.streaming.datasource`` do not exist: importing them from here
gives stand-ins (so the replayable reader's class can be defined), and :func:`require` keeps that
reader from ever being created. Importing this module imports nothing of PySpark.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        SupportsTriggerAvailableNow,
    )
    from pyspark.sql.types import StructType

__all__ = [
    "BATCH_READ",
    "BATCH_WRITE",
    "DRIVER_STREAM_CONTROL",
    "DRIVER_STREAM_READ",
    "FEATURES",
    "REPLAYABLE_STREAM_READ",
    "STREAM_WRITE",
    "Feature",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxBytes",
    "SparkVersionError",
    "SupportsTriggerAvailableNow",
    "parse_version",
    "pyspark_version",
    "require",
    "supports",
    "to_arrow_schema",
]


@dataclass(frozen=True, slots=True)
class Feature:
    """A part of the data source and the oldest PySpark whose API has what it needs."""

    name: str
    needs: tuple[int, int]
    api: str
    #: what to use instead on an older PySpark
    instead: str = ""


BATCH_READ = Feature("batch reads", (4, 0), "the Python Data Source API")
BATCH_WRITE = Feature("batch writes", (4, 0), "the Python Data Source API")
STREAM_WRITE = Feature("streaming writes", (4, 0), "DataSourceStreamWriter")
DRIVER_STREAM_READ = Feature(
    "streaming reads with mode=driver", (4, 0), "SimpleDataSourceStreamReader"
)
REPLAYABLE_STREAM_READ = Feature(
    "replayable streaming reads (mode=replayable, or mode=auto on the fork in cluster mode)",
    (4, 2),
    "admission control in DataSourceStreamReader: latestOffset(start, limit), "
    "getDefaultReadLimit, reportLatestOffset, SupportsTriggerAvailableNow",
    instead="read the topic with mode=driver (options 'channel' and 'walPath'), or read "
    "offset ranges with spark.read",
)
DRIVER_STREAM_CONTROL = Feature(
    "mode=driver stopped with its query and Trigger.AvailableNow in mode=driver",
    (4, 2),
    "DataSourceStreamReader with latestOffset(start, limit), stop() and "
    "SupportsTriggerAvailableNow",
    instead="the driver source's consumer closes when the driver's Python source process "
    "ends, and Trigger.AvailableNow is not offered in mode=driver",
)
FEATURES = (
    BATCH_READ,
    BATCH_WRITE,
    STREAM_WRITE,
    DRIVER_STREAM_READ,
    DRIVER_STREAM_CONTROL,
    REPLAYABLE_STREAM_READ,
)

#: ``to_arrow_schema(..., timezone=)`` replaced ``timestamp_utc=`` in 4.2
_ARROW_TIMEZONE = (4, 2)

_VERSION = re.compile(r"(\d+)(?:\.(\d+))?")


class SparkVersionError(ConfigError):
    """The running PySpark is older than what a part of the ``nsq`` data source needs."""

    def __init__(self, feature: Feature, running: str) -> None:
        self.feature = feature
        self.running = running
        self.needed = "{}.{}".format(*feature.needs)
        message = (
            f"{feature.name} need PySpark {self.needed} or later ({feature.api}); this is "
            f"PySpark {running}"
        )
        if feature.instead:
            message += f". On PySpark {running}, {feature.instead}"
        super().__init__(message)


def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a PySpark version: ``"4.1.0.dev1"`` and ``"4.2.0-preview5"`` are
    ``(4, 1)`` and ``(4, 2)``, ``"4"`` is ``(4, 0)``."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise ConfigError(f"cannot tell which PySpark this is: its version is {text!r}")
    return int(match[1]), int(match[2] or 0)


@functools.cache
def pyspark_version() -> str:
    """The installed PySpark's ``__version__``."""
    from pyspark import __version__

    return str(__version__)


def supports(feature: Feature, version: str | None = None) -> bool:
    """Whether PySpark ``version`` (default: the installed one) has what ``feature`` needs."""
    return parse_version(version or pyspark_version()) >= feature.needs


def require(feature: Feature, version: str | None = None) -> None:
    """Raise :class:`SparkVersionError` unless PySpark ``version`` (default: the installed one)
    has what ``feature`` needs."""
    running = version or pyspark_version()
    if not supports(feature, running):
        raise SparkVersionError(feature, running)


def to_arrow_schema(schema: StructType) -> pa.Schema:
    """PySpark's Arrow schema of ``schema`` with UTC timestamps, whichever keyword this PySpark's
    ``to_arrow_schema`` takes for that."""
    from pyspark.sql.pandas.types import to_arrow_schema as convert

    if parse_version(pyspark_version()) >= _ARROW_TIMEZONE:
        return convert(schema, timezone="UTC")
    older: Any = convert  # 4.0/4.1: to_arrow_schema(schema, timestamp_utc=True)
    return older(schema, timestamp_utc=True)


_STREAMING_NAMES = ("ReadAllAvailable", "ReadLimit", "ReadMaxBytes", "SupportsTriggerAvailableNow")


@functools.cache
def _stand_in(name: str) -> type:
    doc = f"PySpark < 4.2 has no {name}: a stand-in, never instantiated (see nsq_ha.spark.compat)"
    return type(name, (), {"__doc__": doc, "__module__": __name__})


def __getattr__(name: str) -> Any:
    """The names of ``pyspark.sql.streaming.datasource`` (4.2+), or stand-ins before 4.2."""
    if name not in _STREAMING_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if supports(REPLAYABLE_STREAM_READ):
        return getattr(importlib.import_module("pyspark.sql.streaming.datasource"), name)
    return _stand_in(name)
