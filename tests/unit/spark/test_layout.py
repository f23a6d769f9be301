"""The Spark package's shape: the reader side in ``nsq_ha.spark.source``, the writer side in
``nsq_ha.spark.sink``, and at ``nsq_ha.spark`` only what both use; the public names the README
and the docs import stay where they are."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import nsq_ha.spark

#: the modules both sides use: the data source's registration, the options and what they parse,
#: the PySpark version shim, the row schema
SHARED = {
    "compat",
    "datasource",
    "locations",
    "option_names",
    "options",
    "routing_columns",
    "rows",
    "topic_set",
}


def test_spark_holds_the_source_and_sink_packages_and_only_the_shared_modules() -> None:
    found = {m.name: m.ispkg for m in pkgutil.iter_modules(nsq_ha.spark.__path__)}
    assert {name for name, package in found.items() if package} == {"source", "sink"}
    assert {name for name, package in found.items() if not package} == SHARED


@pytest.mark.parametrize(
    "name",
    [
        "register",
        "with_nsq_partition",
        "co_partition",
        "partition_count",
        "OptionError",
        "ReadOptions",
        "WriteOptions",
        "parse_read_options",
        "parse_write_options",
        "STAMP_KEYS",
    ],
)
def test_the_documented_names_import_from_nsq_ha_spark(name: str) -> None:
    assert getattr(nsq_ha.spark, name) is not None
    assert name in nsq_ha.spark.__all__


def test_the_data_source_and_the_compat_shim_keep_their_paths() -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    datasource = importlib.import_module("nsq_ha.spark.datasource")
    compat = importlib.import_module("nsq_ha.spark.compat")
    assert datasource.NsqDataSource.name() == "nsq"
    assert callable(compat.require)
    assert callable(compat.supports)


def test_a_read_loads_neither_the_sink_nor_the_producer() -> None:
    """Spark's Python processes import the data source (and, in a task, the readers) for a
    read; each fresh one pays for every module it loads, and a read needs no sink, no producer
    and no blocking client."""
    pytest.importorskip("pyarrow", reason="the spark extra is not installed")
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    code = (
        "import sys, nsq_ha.spark.datasource, nsq_ha.spark.source.readers; "
        "print(sorted(m for m in sys.modules if m.startswith(('nsq_ha.spark.sink', "
        "'nsq_ha.producer', 'nsq_ha.sync', 'nsq_ha.spark.source.driver'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
