"""The records ``nsq-ha pub`` reads (:mod:`nsq_ha.cli.records`): split the same whatever the
chunking, in linear time, in bounded memory (a record over the limit is skipped to the next
delimiter), and by a reader that stops at once when asked, even on a pipe that stays open."""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_ha.cli.records import CHUNK, Oversized, Piece, RecordSplitter, read_records

MiB = 1024 * 1024


def _split(data: bytes, delimiter: bytes | None, max_size: int, size: int) -> list[Piece]:
    splitter = RecordSplitter(delimiter, max_size)
    pieces: list[Piece] = []
    for at in range(0, len(data), size):
        pieces += splitter.feed(data[at : at + size])
    return pieces + splitter.end()


def _expected(data: bytes, delimiter: bytes, max_size: int) -> list[Piece]:
    """What ``bytes.split`` makes of ``data`` (the last empty piece dropped; a line's ``\r``
    dropped), with every piece over ``max_size`` as Oversized."""
    pieces = data.split(delimiter)
    if pieces[-1] == b"":
        pieces.pop()
    if delimiter == b"\n":
        pieces = [p.removesuffix(b"\r") for p in pieces]
    return [p if len(p) <= max_size else Oversized(len(p), max_size) for p in pieces]


@pytest.mark.parametrize(
    ("data", "delimiter", "records"),
    [
        (b"a\nb\r\nc", b"\n", [b"a", b"b", b"c"]),
        (b"a\nb\n", b"\n", [b"a", b"b"]),
        (b"a\r", b"\n", [b"a"]),
        (b"a\0b\0\0c", b"\0", [b"a", b"b", b"", b"c"]),
        (b"x||y||", b"||", [b"x", b"y"]),
        (b"x|||y", b"||", [b"x", b"|y"]),
        (b"one\ntwo\n", None, [b"one\ntwo\n"]),
        (b"", None, [b""]),
        (b"", b"\n", []),
    ],
)
@pytest.mark.parametrize("size", [1, 2, 3, CHUNK])
def test_records_whatever_the_chunking(
    data: bytes, delimiter: bytes | None, records: list[bytes], size: int
) -> None:
    assert _split(data, delimiter, 100, size) == records


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(
        st.sampled_from([b"a", b"bc", b"|", b"||", b"\0", b"\r", b"\n"]), max_size=60
    ).map(b"".join),
    delimiter=st.sampled_from([b"|", b"||", b"|\0|", b"\0", b"\n"]),
    max_size=st.integers(1, 8),
    size=st.integers(1, 9),
)
def test_records_match_a_plain_split(
    data: bytes, delimiter: bytes, max_size: int, size: int
) -> None:
    """Any chunking gives what one ``bytes.split`` gives, records over the limit included."""
    assert _split(data, delimiter, max_size, size) == _expected(data, delimiter, max_size)


def test_a_line_may_carry_its_carriage_return_beyond_the_limit() -> None:
    assert _split(b"abcd\r\nabcde\r\n", b"\n", 4, 2) == [b"abcd", Oversized(5, 4)]


@pytest.mark.parametrize("delimiter", [b"\x1e", b"||", b"\r\n"])
def test_each_byte_is_searched_once_however_long_the_record(delimiter: bytes) -> None:
    """32 MiB without the delimiter, fed in 64 KiB chunks: every byte is searched once (and
    the last ``len(delimiter) - 1`` bytes of a chunk again with the next), not the whole
    buffer again at every chunk. The limit is set above the input, so nothing is skipped."""
    splitter = RecordSplitter(delimiter, 64 * MiB)
    chunk = b"r" * CHUNK
    count = 32 * MiB // CHUNK
    for _ in range(count):
        assert splitter.feed(chunk) == []
    assert splitter.scanned <= count * CHUNK + count * (len(delimiter) - 1)
    assert splitter.end() == [b"r" * (32 * MiB)]


def _fed(splitter: RecordSplitter, chunks: Iterator[bytes]) -> tuple[list[Piece], int]:
    pieces: list[Piece] = []
    most = 0
    for chunk in chunks:
        pieces += splitter.feed(chunk)
        most = max(most, splitter.buffered)
    return pieces + splitter.end(), most


@pytest.mark.parametrize("delimiter", [b"\n", b"||", None])
def test_a_record_over_the_limit_is_skipped_in_bounded_memory(delimiter: bytes | None) -> None:
    """A 16 MiB record with a 1 MiB limit: reported as Oversized with its size, never held
    (the splitter holds at most the limit and one chunk); the next record is whole."""
    sep = delimiter or b""
    chunks = iter([b"r" * CHUNK] * (16 * MiB // CHUNK) + [sep + b"next" + sep])
    pieces, most = _fed(RecordSplitter(delimiter, MiB), chunks)
    assert most <= MiB + 1 + CHUNK
    if delimiter is None:
        assert pieces == [Oversized(16 * MiB + 4, MiB)]
    else:
        assert pieces == [Oversized(16 * MiB, MiB), b"next"]


async def _read(data: bytes, delimiter: bytes | None, max_size: int = 100) -> list[Piece]:
    stream = io.BufferedReader(io.BytesIO(data))
    return [r async for r in read_records(stream, delimiter, max_size=max_size)]


async def test_read_records_from_a_stream() -> None:
    assert await _read(b"a\nb\r\nc", b"\n") == [b"a", b"b", b"c"]
    data = b"r" * (CHUNK - 1) + b"||" + b"s"
    assert await _read(data, b"||", max_size=CHUNK) == [b"r" * (CHUNK - 1), b"s"]
    assert await _read(b"x" * 101 + b"\ny\n", b"\n") == [Oversized(101, 100), b"y"]


async def test_stop_ends_a_read_waiting_on_a_pipe_that_stays_open() -> None:
    """The write end stays open: once the records written are out, ``on_idle`` is awaited
    (the reader is about to wait for input); setting ``stop`` then ends the records at once."""
    reading, writing = os.pipe()
    stream = open(reading, "rb", closefd=False)  # noqa: SIM115, ASYNC230 - a pipe; closed below
    stop = asyncio.Event()
    waiting = asyncio.Event()
    got: list[Piece] = []

    async def on_idle() -> None:
        if got == [b"a", b"b"]:
            waiting.set()

    async def read_all() -> None:
        async for record in read_records(stream, b"\n", max_size=100, stop=stop, on_idle=on_idle):
            got.append(record)

    try:
        os.write(writing, b"a\nb\n")
        reader = asyncio.create_task(read_all())
        async with asyncio.timeout(10):
            await waiting.wait()
            stop.set()
            await reader
        assert got == [b"a", b"b"]
    finally:
        os.close(writing)  # the reader thread's blocked read ends (EOF), then the thread exits
        stream.close()
        os.close(reading)
