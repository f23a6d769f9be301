"""The ``nsq`` data source: the entry point Spark's Python Data Source API calls, handing out
the readers (:mod:`.source.readers`, :mod:`.source.driver`) and writers (:mod:`.sink.writers`).

Spark asks a read for its schema at ``load()`` (unless the read was given one): the options
are checked there, so a bad one fails ``load()`` rather than a stream's ``start()``, where
PySpark reports it behind an ``UnboundLocalError`` of its own. A write's are checked when Spark
makes its writer, at ``save()`` or ``start()``.
"""

from __future__ import annotations

from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from ..errors import ConfigError
from .compat import DRIVER_STREAM_CONTROL, REPLAYABLE_STREAM_READ, require, supports
from .options import ReadOptions, check_read_options, parse_read_options
from .rows import SCHEMA

__all__ = ["NsqDataSource"]


class NsqDataSource(DataSource):
    """``format("nsq")``: batch and streaming writes, streaming reads (see :mod:`nsq_ha.spark`)."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        """Called at ``load()`` (without a given schema), before Spark says batch or stream."""
        check_read_options(self.options)
        return SCHEMA

    # Each side is imported when Spark asks for it: a Python process of Spark's loads this
    # module for one read or one write, and each fresh one pays for what it imports.

    def reader(self, schema: StructType) -> DataSourceReader:
        from .source.readers import NsqBatchReader

        return NsqBatchReader(parse_read_options(self.options, batch=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink.writers import batch_writer, write_options

        return batch_writer(write_options(self.options, schema), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink.writers import stream_writer, write_options

        return stream_writer(write_options(self.options, schema), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .source.driver import NsqDriverStreamReader
        from .source.readers import NsqReplayableReader, read_mode

        opts = parse_read_options(self.options)
        if read_mode(opts) == "replayable":
            require(REPLAYABLE_STREAM_READ)  # PySpark 4.2+ (nsq_ha.spark.compat)
            return NsqReplayableReader(opts)
        if supports(DRIVER_STREAM_CONTROL):  # 4.2+: stopped with the query, AvailableNow
            _need_channel(opts)
            return NsqDriverStreamReader(opts)
        # before 4.2 Spark then asks for simpleStreamReader
        raise PySparkNotImplementedError(
            errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
        )

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        from .source.driver import NsqDriverReader

        opts = parse_read_options(self.options)
        _need_channel(opts)
        return NsqDriverReader(opts)


def _need_channel(opts: ReadOptions) -> None:
    if opts.channel is None:
        raise ConfigError(
            "mode=driver consumes as a channel of the topic: set the option 'channel' "
            "(queries sharing a channel share its messages)"
        )
