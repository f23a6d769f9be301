"""FrameReader over a transport that pushes its reads: how the read ends."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from nsq_ha.connection import reader as reader_module
from nsq_ha.connection.reader import FrameReader, PendingAnswers
from nsq_ha.errors import ConnectionClosedError, NsqError
from nsq_ha.protocol.session import ClientSession


class PushingTransport:
    """Stands in for the StreamTransport: keeps the reader's callbacks to call them by hand."""

    address = "127.0.0.1:4150"

    def __init__(self) -> None:
        self.on_data: Callable[[bytes], None] | None = None
        self.on_end: Callable[[NsqError | None], None] | None = None
        self.stopped = 0

    def receive(
        self, on_data: Callable[[bytes], None], on_end: Callable[[NsqError | None], None]
    ) -> None:
        self.on_data, self.on_end = on_data, on_end

    def stop_receiving(self) -> None:
        self.stopped += 1


def reader() -> tuple[FrameReader, PushingTransport]:
    transport = PushingTransport()
    frames = FrameReader(
        ClientSession(),
        transport,  # type: ignore[arg-type]
        PendingAnswers(),
        deliver=lambda message: None,
        on_error=None,
    )
    return frames, transport


async def test_the_peer_closing_ends_the_read_with_connection_closed() -> None:
    frames, transport = reader()
    task = asyncio.create_task(frames.run())
    await asyncio.sleep(0)
    assert transport.on_end is not None
    transport.on_end(None)
    with pytest.raises(ConnectionClosedError, match="closed the connection"):
        await task
    assert transport.stopped >= 1


async def test_a_reset_ends_the_read_with_its_own_error() -> None:
    frames, transport = reader()
    task = asyncio.create_task(frames.run())
    await asyncio.sleep(0)
    assert transport.on_end is not None
    transport.on_end(ConnectionClosedError("reading from 127.0.0.1:4150: reset by peer"))
    with pytest.raises(ConnectionClosedError, match="reset by peer"):
        await task


async def test_bytes_that_break_the_protocol_end_the_read() -> None:
    frames, transport = reader()
    task = asyncio.create_task(frames.run())
    await asyncio.sleep(0)
    assert transport.on_data is not None
    transport.on_data(b"\x00\x00\x00\x06\x00\x00\x00\x07xy")  # frame type 7 does not exist
    with pytest.raises(NsqError):
        await task
    assert transport.stopped >= 1


def test_the_reader_module_has_no_async_generator() -> None:
    """The compiled build compiles this module, and mypyc cannot compile an async generator
    (read from the source, which both builds share)."""
    tree = ast.parse((Path(reader_module.__file__ or "").parent / "reader.py").read_text())
    generators = [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef)
        and any(isinstance(inner, ast.Yield | ast.YieldFrom) for inner in ast.walk(node))
    ]
    assert generators == []


def test_the_reader_shows_its_peer_and_session() -> None:
    frames, _ = reader()
    assert repr(frames).startswith("<FrameReader 127.0.0.1:4150 <ClientSession ")
