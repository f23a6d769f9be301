"""The command line's stdout: a write never blocks the event loop, and a reader that goes away
is noticed (on the next write, or with nothing to write) without an exception."""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
from collections.abc import Iterator

import pytest

from nsq_ha.cli.stdout import Stdout


def _text(fd: int) -> io.TextIOWrapper:
    """The write end ``fd`` of a pipe as a text stream (closing it closes ``fd``)."""
    return open(fd, "w", encoding="utf-8")


@pytest.fixture
def pipe() -> Iterator[tuple[int, io.TextIOWrapper]]:
    """(the read end, the write end as a text stream)."""
    read_end, write_end = os.pipe()
    stream = _text(write_end)
    try:
        yield read_end, stream
    finally:
        stream.close()
        os.close(read_end)


async def test_lines_arrive_whole_and_in_order(pipe: tuple[int, io.TextIOWrapper]) -> None:
    read_end, stream = pipe
    async with Stdout(stream) as out:
        assert await out.write("one\n")
        assert await out.write("two é\n")
    assert os.read(read_end, 100) == "one\ntwo é\n".encode()


async def test_a_write_after_the_reader_left_is_refused_quietly() -> None:
    read_end, write_end = os.pipe()
    with _text(write_end) as stream:
        async with Stdout(stream) as out:
            assert await out.write("seen\n")
            os.close(read_end)  # the only reader: the pipe is broken
            assert not await out.write("lost\n")
            assert out.gone.is_set()
            assert not await out.write("again\n")
        stream.write("after\n")  # descriptor 1's flush at exit: /dev/null now, no EPIPE
        stream.flush()


async def test_the_reader_leaving_is_noticed_with_nothing_to_write() -> None:
    read_end, write_end = os.pipe()
    with _text(write_end) as stream:
        async with Stdout(stream) as out:
            assert await out.write("x\n")
            os.close(read_end)
            await asyncio.wait_for(out.gone.wait(), 5.0)


async def test_a_write_nobody_reads_leaves_the_loop_free(
    pipe: tuple[int, io.TextIOWrapper],
) -> None:
    read_end, stream = pipe
    capacity = fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.ensure_future(tick())
    async with Stdout(stream) as out:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(out.write("x" * (2 * capacity)), 0.3)
        assert ticks >= 5  # the loop ran while the write was blocked
        # the write goes on in its thread: read it all, so the thread ends
        got = 0
        os.set_blocking(read_end, True)
        while got < 2 * capacity:
            got += len(os.read(read_end, 65536))
        assert got == 2 * capacity
    ticker.cancel()


async def test_short_lines_to_a_full_pipe_leave_the_loop_free(
    pipe: tuple[int, io.TextIOWrapper],
) -> None:
    """Short lines go straight to a pipe with room; once it is full they wait in the thread."""
    read_end, stream = pipe
    capacity = fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ)
    line = "y" * 999 + "\n"
    lines = capacity // len(line) + 10
    written = 0

    async def write_all(out: Stdout) -> None:
        nonlocal written
        for _ in range(lines):
            assert await out.write(line)
            written += 1

    async with Stdout(stream) as out:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(write_all(out), 0.5)
        assert capacity // len(line) - 5 <= written < lines
        got = b""
        while len(got) < written * len(line):
            got += os.read(read_end, 65536)
        assert got == line.encode() * written


async def test_a_stream_without_a_descriptor_is_written_directly() -> None:
    stream = io.StringIO()
    async with Stdout(stream) as out:
        assert await out.write("a\n")
    assert stream.getvalue() == "a\n"
