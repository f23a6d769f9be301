"""FrameReader over a transport that pushes its reads: how the read ends."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from nsq_ha._compiled_finder import source_path
from nsq_ha.connection import reader as reader_module
from nsq_ha.connection.reader import FrameReader, PendingAnswers
from nsq_ha.errors import ConnectionClosedError, NsqError
from nsq_ha.protocol.session import ClientSession
from tests.unit.connection.wire import Pushed


def reader() -> tuple[FrameReader, Pushed]:
    pushed = Pushed()
    frames = FrameReader(
        ClientSession(),
        pushed.transport,
        PendingAnswers(),
        deliver=lambda message: None,
        on_error=None,
    )
    return frames, pushed


async def test_the_peer_closing_ends_the_read_with_connection_closed() -> None:
    frames, transport = reader()
    task = asyncio.create_task(frames.run())
    await asyncio.sleep(0)
    assert transport.receiving
    transport.end(None)
    with pytest.raises(ConnectionClosedError, match="closed the connection"):
        await task
    assert not transport.receiving


async def test_a_reset_ends_the_read_with_its_own_error() -> None:
    frames, transport = reader()
    task = asyncio.create_task(frames.run())
    await asyncio.sleep(0)
    assert transport.receiving
    transport.end(ConnectionClosedError("reading from 127.0.0.1:4150: reset by peer"))
    with pytest.raises(ConnectionClosedError, match="reset by peer"):
        await task


async def test_bytes_that_break_the_protocol_end_the_read() -> None:
    frames, transport = reader()
    task = asyncio.create_task(frames.run())
    await asyncio.sleep(0)
    assert transport.receiving
    transport.push(b"\x00\x00\x00\x06\x00\x00\x00\x07xy")  # frame type 7 does not exist
    with pytest.raises(NsqError):
        await task
    assert not transport.receiving


def test_the_reader_module_has_no_async_generator() -> None:
    """The compiled build compiles this module, and mypyc cannot compile an async generator
    (read from the source, which both builds share)."""
    tree = ast.parse(Path(source_path(reader_module.__name__)).read_text())
    generators = [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef)
        and any(isinstance(inner, ast.Yield | ast.YieldFrom) for inner in ast.walk(node))
    ]
    assert generators == []


async def test_the_reader_shows_its_peer_and_session() -> None:
    frames, _ = reader()
    assert repr(frames).startswith("<FrameReader 127.0.0.1:4150 <ClientSession ")
