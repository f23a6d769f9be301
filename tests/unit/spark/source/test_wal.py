"""The driver source's write-ahead log (:mod:`nsq_ha.spark.source.wal`) on a local path, a ``file://``
URI and file systems that are not local (pyarrow's in-memory ``mock://`` one, a sub-tree, and a
recording ``PyFileSystem`` whose transcript shows how a batch is written); the driver reader on
top of it. No Spark and no server needed."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nsq_ha.errors import ConfigError
from nsq_ha.spark.locations import redact_location
from nsq_ha.spark.options import OptionError, parse_read_options
from nsq_ha.spark.source.driver_reader import DriverReader
from nsq_ha.spark.source.extents import DataLossError
from nsq_ha.spark.source.wal import WriteAheadLog, decode_row, encode_rows, writes_in_place

pafs = pytest.importorskip("pyarrow.fs", reason="the spark extra is not installed")
Handler: Any = pafs.FileSystemHandler

ROWS = [
    (
        "orders",
        3,
        4096,
        48,
        "0a" * 16,
        -1,
        2,
        datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=UTC),
        '{"nsq_key":"ü7"}',
        "ü7",
        b"\x00\xff\n{binary}\r\n",
        {"nsq_key": "ü7"},
    ),
    (
        "orders",
        0,
        None,
        None,
        "0b" * 16,
        None,
        1,
        datetime(2024, 3, 1, 1, 2, 3, tzinfo=timezone(timedelta(hours=2))),
        None,
        None,
        b"",
        None,
    ),
]
# the line the first versions (a local path only, open/fsync/os.replace) wrote for ROWS[0],
# before rows had ``headers``
OLD_LINE = (
    '["orders", 3, 4096, 48, "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a", -1, 2, '
    '"2024-02-29T23:59:58.123456+00:00", "{\\"nsq_key\\":\\"\\u00fc7\\"}", "\\u00fc7", '
    '"AP8Ke2JpbmFyeX0NCg=="]\n'
)


def _names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


# -- the format ------------------------------------------------------------------------------


def test_the_encoding_is_the_first_versions_json_lines_with_the_headers_appended() -> None:
    assert encode_rows(ROWS[:1]) == OLD_LINE[:-2].encode() + b', {"nsq_key": "\\u00fc7"}]\n'
    # a line written before rows had headers reads as a row with the ext header's map
    assert decode_row(OLD_LINE) == ROWS[0]
    assert decode_row(OLD_LINE.encode()) == ROWS[0]
    assert [decode_row(line) for line in encode_rows(ROWS).splitlines()] == ROWS


# -- local path and file:// URI --------------------------------------------------------------


@pytest.mark.parametrize("as_uri", [False, True], ids=["path", "file-uri"])
def test_a_batch_round_trips_with_its_timestamps_and_bytes(tmp_path: Path, as_uri: bool) -> None:
    directory = tmp_path / "check point" / "wal"  # a space: the URI form percent-encodes it
    location = directory.as_uri() if as_uri else str(directory)
    wal = WriteAheadLog(location)
    assert str(wal) == location
    wal.write(7, ROWS)
    assert _names(directory) == {"7.jsonl"}  # no .tmp left behind
    assert (directory / "7.jsonl").read_bytes() == encode_rows(ROWS)
    rows = wal.read(7)
    assert rows is not None
    back = list(rows)
    assert back == ROWS
    assert back[1][7].utcoffset() == timedelta(hours=2)
    assert wal.exists(7)
    assert not wal.exists(8)
    wal.write(7, ROWS[1:])  # the same number again replaces the batch
    assert list(wal.read(7) or ()) == ROWS[1:]


def test_a_relative_path_is_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    wal = WriteAheadLog("ckpt/wal")
    wal.write(1, ROWS)
    assert (tmp_path / "ckpt" / "wal" / "1.jsonl").read_bytes() == encode_rows(ROWS)
    assert str(wal) == "ckpt/wal"


def test_a_file_of_the_first_versions_is_read(tmp_path: Path) -> None:
    (tmp_path / "3.jsonl").write_text(OLD_LINE, encoding="utf-8")
    assert list(WriteAheadLog(str(tmp_path)).read(3) or ()) == [ROWS[0]]


def test_a_missing_batch_is_none_even_without_the_directory(tmp_path: Path) -> None:
    wal = WriteAheadLog(str(tmp_path / "not-yet"))
    assert wal.read(1) is None
    assert not wal.exists(1)
    assert wal.drop_before(10) == 0
    wal.create()
    assert (tmp_path / "not-yet").is_dir()
    assert wal.read(1) is None


def test_a_leftover_tmp_file_is_never_a_batch(tmp_path: Path) -> None:
    wal = WriteAheadLog(str(tmp_path))
    (tmp_path / "4.tmp").write_bytes(OLD_LINE.encode()[:20])  # a crash in the middle of a write
    assert wal.read(4) is None
    assert not wal.exists(4)
    wal.write(4, ROWS)
    assert _names(tmp_path) == {"4.jsonl"}
    assert list(wal.read(4) or ()) == ROWS


def test_a_write_that_fails_leaves_the_batch_it_would_replace(tmp_path: Path) -> None:
    wal = WriteAheadLog(str(tmp_path))
    wal.write(2, ROWS[:1])
    broken = (*ROWS[1][:10], "not bytes")
    with pytest.raises(TypeError):
        wal.write(2, [ROWS[1], broken])
    with pytest.raises(TypeError):
        wal.write(3, [broken])
    assert _names(tmp_path) == {"2.jsonl"}
    assert list(wal.read(2) or ()) == ROWS[:1]


def test_drop_before_deletes_older_batches_and_their_tmp_files_only(tmp_path: Path) -> None:
    wal = WriteAheadLog(str(tmp_path))
    for seq in range(1, 6):
        wal.write(seq, ROWS[:1])
    others = {"2.tmp", "9.tmp", "notes.txt", "x.jsonl", "1.jsonl.bak", "-1.jsonl", "².jsonl"}
    for name in others:
        (tmp_path / name).write_text("not a batch")
    (tmp_path / "0.jsonl").mkdir()  # a directory is not a batch file either
    assert wal.drop_before(4) == 4  # 1, 2, 3 and 2.tmp
    assert _names(tmp_path) == {"0.jsonl", "4.jsonl", "5.jsonl"} | others - {"2.tmp"}
    assert wal.drop_before(4) == 0


# -- locations that cannot be used, and credentials ------------------------------------------


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("nope://host/wal", "Unrecognized filesystem type"),
        ("file://host/wal", "Unsupported hostname"),
        ("file:///", "names no directory"),
        ("s3://bucket/wal?regoin=eu-west-1", "Unexpected query parameter"),
        ("", "is empty"),
    ],
)
def test_a_location_pyarrow_cannot_open_is_a_config_error(location: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as caught:
        WriteAheadLog(location)
    assert caught.value.__cause__ is None  # pyarrow's own text may quote the secrets


@pytest.mark.parametrize(
    ("location", "shown"),
    [
        ("nope://AKIDEXAMPLE:hunter2@host/wal", "nope://***@host/wal is not a location"),
        # an unescaped "/" in the secret: pyarrow cannot parse it, and quotes it
        ("s3://AKIDEXAMPLE:hunter/2@bucket/wal", "Cannot parse URI: 's3://***@bucket/wal'"),
        ("s3://bucket/wal?secret_key=hunter2", "s3://bucket/wal?secret_key=*** is not"),
    ],
)
def test_errors_never_show_the_credentials(location: str, shown: str) -> None:
    with pytest.raises(ConfigError) as caught:
        WriteAheadLog(location)
    assert shown in str(caught.value)
    assert "hunter" not in str(caught.value)
    assert "AKIDEXAMPLE" not in str(caught.value)


def test_the_repr_never_shows_the_credentials() -> None:
    wal = WriteAheadLog("s3://AKIDEXAMPLE:hunter2@bucket/wal?region=eu-west-1")
    assert (
        repr(wal) == "<WriteAheadLog s3://***@bucket/wal?region=eu-west-1 on s3, writes in place>"
    )
    assert str(wal) == "s3://***@bucket/wal?region=eu-west-1"


@pytest.mark.parametrize(
    ("location", "shown"),
    [
        ("/data/ckpt/wal", "/data/ckpt/wal"),
        ("hdfs://namenode:8020/ckpt/wal", "hdfs://namenode:8020/ckpt/wal"),
        ("s3://key:secret@bucket/wal", "s3://***@bucket/wal"),
        ("gs://token@bucket/wal", "gs://***@bucket/wal"),
        (
            "abfs://acct.dfs.core.windows.net/c/wal?client_id=me&client_secret=s3cr3t&tenant_id=t",
            "abfs://acct.dfs.core.windows.net/c/wal?client_id=me&client_secret=***&tenant_id=t",
        ),
        (
            "s3://b/wal?region=x&Secret_Access_Key=k&sig=abc",
            "s3://b/wal?region=x&Secret_Access_Key=***&sig=***",
        ),
        ("see 'nope://u:p@h/x' here", "see 'nope://***@h/x' here"),
    ],
)
def test_redact_location(location: str, shown: str) -> None:
    assert redact_location(location) == shown


# -- file systems that are not local ---------------------------------------------------------


class Recording(Handler):  # type: ignore[misc]
    """A ``PyFileSystem`` handler over pyarrow's in-memory file system that records every call
    that changes it (as go-nsq's mock nsqd records commands)."""

    def __init__(self) -> None:
        self.inner = pafs.FileSystem.from_uri("mock://memory/")[0]
        self.calls: list[tuple[str, ...]] = []

    def get_type_name(self) -> str:
        return "recording"

    def normalize_path(self, path: str) -> str:
        return str(self.inner.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> Any:
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self.inner.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.calls.append(("create_dir", path))
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.calls.append(("delete_dir", path))
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.calls.append(("delete_dir_contents", path))
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.calls.append(("delete_root_dir_contents",))
        self.inner.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self.calls.append(("delete_file", path))
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.calls.append(("move", src, dest))
        self.inner.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.calls.append(("copy_file", src, dest))
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        self.calls.append(("open_output_stream", path))
        return self.inner.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        self.calls.append(("open_append_stream", path))
        return self.inner.open_append_stream(path, metadata=metadata)


def test_the_in_memory_file_system_of_a_mock_uri() -> None:
    wal = WriteAheadLog("mock://memory/ckpt/wal")
    assert "on mock, writes via .tmp" in repr(wal)
    assert wal.read(1) is None
    for seq in (1, 2, 3):
        wal.write(seq, ROWS[seq % 2 :])
    assert [list(wal.read(seq) or ()) for seq in (1, 2, 3)] == [ROWS[1:], ROWS, ROWS[1:]]
    assert wal.drop_before(3) == 2
    assert (wal.exists(1), wal.exists(2), wal.exists(3)) == (False, False, True)


def test_a_sub_tree_file_system_is_written_through_pyarrow_alone(tmp_path: Path) -> None:
    filesystem = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    wal = WriteAheadLog("ckpt/wal", filesystem=filesystem)
    wal.write(1, ROWS)
    assert _names(tmp_path / "ckpt" / "wal") == {"1.jsonl"}
    assert (tmp_path / "ckpt" / "wal" / "1.jsonl").read_bytes() == encode_rows(ROWS)
    assert list(wal.read(1) or ()) == ROWS


def test_a_batch_goes_to_a_tmp_file_then_is_moved_into_place() -> None:
    handler = Recording()
    wal = WriteAheadLog("wal", filesystem=pafs.PyFileSystem(handler))
    wal.write(1, ROWS)
    wal.write(2, ROWS)
    assert handler.calls == [
        ("create_dir", "wal"),
        ("open_output_stream", "wal/1.tmp"),
        ("move", "wal/1.tmp", "wal/1.jsonl"),
        ("open_output_stream", "wal/2.tmp"),
        ("move", "wal/2.tmp", "wal/2.jsonl"),
    ]
    handler.calls.clear()
    assert wal.drop_before(2) == 1
    assert handler.calls == [("delete_file", "wal/1.jsonl")]
    assert list(wal.read(2) or ()) == ROWS


def test_on_an_object_store_a_batch_is_one_write_of_its_final_object() -> None:
    handler = Recording()
    handler.inner.create_dir("wal")  # pyarrow's in-memory file system has directories
    wal = WriteAheadLog("wal", filesystem=pafs.PyFileSystem(handler), in_place=True)
    wal.create()
    wal.write(1, ROWS)
    assert handler.calls == [("open_output_stream", "wal/1.jsonl")]
    assert list(wal.read(1) or ()) == ROWS


@pytest.mark.parametrize(
    ("type_name", "in_place"),
    [("s3", True), ("gcs", True), ("abfs", True), ("local", False), ("hdfs", False)],
)
def test_which_file_systems_are_written_in_place(type_name: str, in_place: bool) -> None:
    filesystem = SimpleNamespace(type_name=type_name)
    assert writes_in_place(filesystem) is in_place
    assert writes_in_place(SimpleNamespace(type_name="subtree", base_fs=filesystem)) is in_place


# -- the driver reader on the log ------------------------------------------------------------


def _driver_options(wal_path: str, **more: str) -> Any:
    options = {"nsqd": "127.0.0.1:4150", "topic": "t", "mode": "driver", "channel": "c"}
    return parse_read_options({**options, "walPath": wal_path, **more})


def test_the_driver_reader_refuses_a_bad_wal_path_when_it_is_created() -> None:
    with pytest.raises(OptionError, match=r"option 'walPath': nope://\*\*\*@h/x is not") as caught:
        DriverReader(_driver_options("nope://u:pw@h/x"), "c")
    assert "pw" not in str(caught.value)


def test_the_driver_reader_replays_and_drops_batches_of_a_uri_location(tmp_path: Path) -> None:
    (tmp_path / "1.jsonl").write_text(OLD_LINE, encoding="utf-8")  # from an older version
    reader = DriverReader(_driver_options(tmp_path.as_uri()), "c")
    reader.wal.write(2, ROWS[1:])
    assert list(reader.replay(1, 2)) == ROWS
    missing = f"batch 3 of 't' is not in {re.escape(tmp_path.as_uri())}: it cannot be replayed"
    with pytest.raises(DataLossError, match=missing):
        list(reader.replay(2, 3))
    reader.commit(2)
    assert _names(tmp_path) == {"2.jsonl"}  # the newest committed batch stays
    lenient = DriverReader(_driver_options(str(tmp_path), failOnDataLoss="false"), "c")
    assert list(lenient.replay(1, 3)) == ROWS[1:]


def test_rows_are_json_arrays_one_a_line() -> None:
    lines = encode_rows(ROWS).decode().splitlines()
    assert [len(json.loads(line)) for line in lines] == [12, 12]
