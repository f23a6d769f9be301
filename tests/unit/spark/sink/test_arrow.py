"""The record batches a write task gets from Spark's Arrow writers: their rows, valued as
Spark's own rows are for the columns the sink reads, and the body and key columns read whole
when every value is one the row path takes as it is."""

from __future__ import annotations

import decimal
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow", reason="the spark extra is not installed")

from nsq_ha.spark.sink.arrow import arrow_rows, plain_columns  # noqa: E402


def test_arrow_rows_hold_the_used_columns_valued_like_spark_rows() -> None:
    headers = pa.array([[("a", "1")], None, []], type=pa.map_(pa.string(), pa.string()))
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([b"x", b"y", b"z"], type=pa.binary()),
            pa.array(["k1", None, "k3"]),
            headers,
            pa.array([1, 2, 3], type=pa.int32()),
            pa.array(
                [decimal.Decimal("1.50"), None, decimal.Decimal("0.00")], pa.decimal128(10, 2)
            ),
        ],
        names=["body", "key", "headers", "unused", "d"],
    )
    rows = list(arrow_rows(iter([batch, batch.slice(0, 1)]), ["body", "key", "headers", "d"]))
    assert rows == [
        {"body": b"x", "key": "k1", "headers": {"a": "1"}, "d": decimal.Decimal("1.50")},
        {"body": b"y", "key": None, "headers": None, "d": None},
        {"body": b"z", "key": "k3", "headers": {}, "d": decimal.Decimal("0.00")},
        {"body": b"x", "key": "k1", "headers": {"a": "1"}, "d": decimal.Decimal("1.50")},
    ]


@pytest.mark.parametrize(
    ("body", "key", "expected"),
    [
        (pa.array([b"a", b"b"]), pa.array(["k", "l"]), ([b"a", b"b"], ["k", "l"])),
        (
            pa.array(["a", "\u00e9"]),
            pa.array([b"k", b"l"]),
            ([b"a", "\u00e9".encode()], [b"k", b"l"]),
        ),
        (
            pa.array([b"a", b"b"], pa.large_binary()),
            pa.array([7, 8], pa.int64()),
            ([b"a", b"b"], [7, 8]),
        ),
        (pa.array(["a", "b"], pa.large_string()), None, ([b"a", b"b"], None)),
    ],
    ids=["binary-string", "string-binary", "large-int", "no-key"],
)
def test_plain_columns_are_the_bodies_and_keys_the_rows_would_give(
    body: Any, key: Any, expected: tuple[list[bytes], list[Any] | None]
) -> None:
    columns = {"body": body} if key is None else {"body": body, "key": key}
    batch = pa.record_batch(columns)
    assert plain_columns(batch, "body", None if key is None else "key") == expected


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (pa.array([b"a", None]), pa.array(["k", "l"])),
        (pa.array([b"a", b""]), pa.array(["k", "l"])),
        (pa.array(["a", ""]), pa.array(["k", "l"])),
        (pa.array([1, 2]), pa.array(["k", "l"])),
        (pa.array([b"a", b"b"]), pa.array(["k", None])),
        (pa.array([b"a", b"b"]), pa.array([True, False])),
        (pa.array([b"a", b"b"]), pa.array([1.5, 2.5])),
    ],
    ids=["null-body", "empty-body", "empty-text", "int-body", "null-key", "bool-key", "float-key"],
)
def test_a_batch_with_a_value_the_row_path_refuses_is_left_to_the_row_path(
    body: Any, key: Any
) -> None:
    """None: the rows are then read one by one, and the row path's error names the row."""
    assert plain_columns(pa.record_batch({"body": body, "key": key}), "body", "key") is None
