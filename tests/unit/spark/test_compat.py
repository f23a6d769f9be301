"""Which PySpark versions the ``nsq`` data source runs on (:mod:`nsq_ha.spark.compat`): version
strings as PySpark spells them, the feature table, the error that names both versions, the
stand-ins for the 4.2 streaming names, and the extra's lower bound matching the table. Versions
are given as strings, so no PySpark is needed except where a test says so."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from nsq_ha.errors import ConfigError, NsqError
from nsq_ha.spark import compat
from nsq_ha.spark.compat import (
    BATCH_READ,
    BATCH_WRITE,
    DRIVER_STREAM_READ,
    FEATURES,
    REPLAYABLE_STREAM_READ,
    STREAM_WRITE,
    Feature,
    SparkVersionError,
    parse_version,
    require,
    supports,
)

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4.0.0", (4, 0)),
        ("4.0.5", (4, 0)),
        ("4.1.0.dev1", (4, 1)),
        ("4.1.4", (4, 1)),
        ("4.2.0-preview5", (4, 2)),
        ("4.2.0rc1", (4, 2)),
        ("4.3.0", (4, 3)),
        ("4.10.2", (4, 10)),
        ("3.5.1+databricks", (3, 5)),
        (" 4.1.4\n", (4, 1)),
        ("4", (4, 0)),
    ],
)
def test_a_version_string_reads_as_major_and_minor(text: str, expected: tuple[int, int]) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "dev", "unknown", "v4.1.0", ".4.1"])
def test_a_version_that_is_not_one_is_refused_by_name(text: str) -> None:
    with pytest.raises(ConfigError, match="cannot tell which PySpark") as caught:
        parse_version(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize(
    ("version", "feature", "ok"),
    [
        ("3.5.1", BATCH_READ, False),
        ("3.5.1", DRIVER_STREAM_READ, False),
        ("4.0.0", BATCH_READ, True),
        ("4.0.0", BATCH_WRITE, True),
        ("4.0.0", STREAM_WRITE, True),
        ("4.0.5", DRIVER_STREAM_READ, True),
        ("4.0.5", REPLAYABLE_STREAM_READ, False),
        ("4.1.0.dev1", REPLAYABLE_STREAM_READ, False),
        ("4.1.4", REPLAYABLE_STREAM_READ, False),
        ("4.2.0.dev0", REPLAYABLE_STREAM_READ, True),
        ("4.2.1", REPLAYABLE_STREAM_READ, True),
        ("4.3.0", REPLAYABLE_STREAM_READ, True),
        ("4.10.0", REPLAYABLE_STREAM_READ, True),  # numbers, not strings: 4.10 > 4.2
        ("5.0.0", REPLAYABLE_STREAM_READ, True),
    ],
)
def test_what_each_version_supports(version: str, feature: Feature, ok: bool) -> None:
    assert supports(feature, version) is ok
    if ok:
        require(feature, version)
    else:
        with pytest.raises(SparkVersionError):
            require(feature, version)


@pytest.mark.parametrize("version", ["4.0.0", "4.0.5", "4.1.0.dev1", "4.1.4"])
def test_the_error_names_the_running_and_the_needed_version_and_what_to_do(version: str) -> None:
    with pytest.raises(SparkVersionError) as caught:
        require(REPLAYABLE_STREAM_READ, version)
    error = caught.value
    assert isinstance(error, ConfigError)
    assert isinstance(error, NsqError)
    assert isinstance(error, ValueError)
    assert (error.running, error.needed, error.feature) == (version, "4.2", REPLAYABLE_STREAM_READ)
    message = str(error)
    assert message.startswith("replayable streaming reads (mode=replayable")
    assert "need PySpark 4.2 or later" in message
    assert f"this is PySpark {version}" in message
    assert "latestOffset(start, limit)" in message  # which API is missing
    assert "mode=driver" in message  # and what works instead


def test_a_feature_without_an_alternative_says_only_the_versions() -> None:
    with pytest.raises(SparkVersionError) as caught:
        require(BATCH_WRITE, "3.5.1")
    assert str(caught.value) == (
        "batch writes need PySpark 4.0 or later (the Python Data Source API); this is PySpark 3.5.1"
    )


def test_the_installed_version_is_used_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "pyspark_version", lambda: "4.1.4")
    assert supports(BATCH_READ)
    assert not supports(REPLAYABLE_STREAM_READ)
    with pytest.raises(SparkVersionError, match=r"this is PySpark 4\.1\.4"):
        require(REPLAYABLE_STREAM_READ)


def test_the_extras_lower_bound_is_the_oldest_version_anything_works_on() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    pins = [req for req in extras["spark"] if req.startswith("pyspark")]
    assert len(pins) == 1
    oldest = min(feature.needs for feature in FEATURES)
    assert pins[0] == "pyspark[sql]>={}.{}".format(*oldest)


def test_before_4_2_the_streaming_names_are_stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "pyspark_version", lambda: "4.1.4")
    stand_in = compat.SupportsTriggerAvailableNow
    assert stand_in.__module__ == "nsq_ha.spark.compat"
    assert stand_in.__name__ == "SupportsTriggerAvailableNow"
    assert compat.ReadLimit is not stand_in
    assert compat.ReadMaxBytes is compat.ReadMaxBytes  # one class per name, every time

    class Reader(compat.ReadLimit, stand_in):  # the replayable reader's definition works
        pass

    assert issubclass(Reader, stand_in)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = compat.Nothing


def test_from_4_2_the_streaming_names_are_pysparks(monkeypatch: pytest.MonkeyPatch) -> None:
    streaming = pytest.importorskip(
        "pyspark.sql.streaming.datasource",
        reason="pyspark.sql.streaming.datasource is PySpark 4.2+ (the stand-ins are tested above)",
    )
    monkeypatch.setattr(compat, "pyspark_version", lambda: "4.2.0")
    assert compat.SupportsTriggerAvailableNow is streaming.SupportsTriggerAvailableNow
    assert compat.ReadMaxBytes is streaming.ReadMaxBytes


def test_the_arrow_schema_has_utc_timestamps_on_the_installed_pyspark() -> None:
    pytest.importorskip("pyarrow", reason="the spark extra is not installed")
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    import pyarrow as pa

    from nsq_ha.spark.source.arrow import row_type

    schema = compat.to_arrow_schema(row_type())
    assert schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert schema.names == [f.name for f in row_type().fields]


@pytest.mark.parametrize("version", ["4.0.5", "4.1.0.dev1"])
def test_the_source_refuses_a_replayable_stream_before_4_2_by_version(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """The data source's own check, before any reader (or Spark session) exists."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from nsq_ha.spark.datasource import NsqDataSource
    from nsq_ha.spark.rows import SCHEMA

    monkeypatch.setattr(compat, "pyspark_version", lambda: version)
    source = NsqDataSource({"lookupd": "http://127.0.0.1:9", "topic": "t", "mode": "replayable"})
    with pytest.raises(SparkVersionError, match=f"this is PySpark {version}"):
        source.streamReader(SCHEMA)  # type: ignore[arg-type]  # a DDL string: the check comes first
