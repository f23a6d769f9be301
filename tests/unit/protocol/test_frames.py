"""FrameDecoder: round trips, arbitrary splits, limits and garbage."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_ha.errors import InvalidArgumentError, NsqError, RemoteProtocolError
from nsq_ha.protocol import FrameDecoder, FrameType
from nsq_ha.protocol.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    HEARTBEAT,
    encode_frame,
    max_frame_size_for,
)


class Frame(NamedTuple):
    """One frame as the decoder gives it, for comparing."""

    frame_type: FrameType
    data: bytes

    def encode(self) -> bytes:
        return encode_frame(self.frame_type, self.data)


frames = st.builds(Frame, st.sampled_from(FrameType), st.binary(max_size=300))


def feed(decoder: FrameDecoder, data: bytes) -> list[Frame]:
    """Add ``data`` to ``decoder`` and return every frame it completed."""
    decoder.receive_data(data)
    frames: list[Frame] = []
    while (parts := decoder.next_parts()) is not None:
        frames.append(Frame(*parts))
    return frames


def test_encode_frame_layout() -> None:
    assert encode_frame(FrameType.RESPONSE, b"OK") == bytes.fromhex("00000006000000004f4b")
    assert encode_frame(1, b"") == bytes.fromhex("0000000400000001")
    heartbeat = encode_frame(FrameType.RESPONSE, HEARTBEAT)
    assert heartbeat == bytes.fromhex("0000000f000000005f6865617274626561745f")


@given(st.lists(frames, max_size=10))
def test_round_trip(items: list[Frame]) -> None:
    stream = b"".join(frame.encode() for frame in items)
    decoder = FrameDecoder()
    assert feed(decoder, stream) == items
    assert decoder.buffered == 0
    decoder.feed_eof()


@given(st.lists(frames, max_size=8), st.data())
def test_any_split_gives_the_same_frames(items: list[Frame], data: st.DataObject) -> None:
    stream = b"".join(frame.encode() for frame in items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    decoder = FrameDecoder()
    decoded: list[Frame] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded += feed(decoder, stream[start:end])
    assert decoded == items


def test_byte_at_a_time_with_next_parts() -> None:
    stream = encode_frame(FrameType.MESSAGE, b"x" * 30) + encode_frame(FrameType.ERROR, b"E_X ")
    decoder = FrameDecoder()
    seen: list[tuple[FrameType, bytes]] = []
    for byte in stream:
        decoder.receive_data(bytes([byte]))
        parts = decoder.next_parts()
        if parts is not None:
            seen.append(parts)
    assert seen == [(FrameType.MESSAGE, b"x" * 30), (FrameType.ERROR, b"E_X ")]
    assert decoder.next_parts() is None


@pytest.mark.parametrize(
    ("stream", "match"),
    [
        (bytes.fromhex("00000003"), "below 4"),
        (bytes.fromhex("00000000"), "below 4"),
        (bytes.fromhex("00000065"), "exceeds the limit of 100"),
        (bytes.fromhex("ffffffff"), "exceeds the limit"),
        (bytes.fromhex("0000000500000003"), "unknown frame type 3"),
        (bytes.fromhex("00000005ffffffff"), "unknown frame type -1"),
    ],
)
def test_bad_frames_raise_and_the_decoder_stays_broken(stream: bytes, match: str) -> None:
    decoder = FrameDecoder(max_frame_size=100)
    with pytest.raises(RemoteProtocolError, match=match):
        feed(decoder, stream)
    assert "broken" in repr(decoder)
    with pytest.raises(RemoteProtocolError, match=match):
        feed(decoder, encode_frame(FrameType.RESPONSE, b"OK"))
    with pytest.raises(RemoteProtocolError, match=match):
        decoder.next_parts()
    with pytest.raises(RemoteProtocolError, match=match):
        decoder.feed_eof()


def test_limit_is_inclusive() -> None:
    decoder = FrameDecoder(max_frame_size=10)
    assert feed(decoder, encode_frame(FrameType.RESPONSE, b"123456")) == [
        Frame(FrameType.RESPONSE, b"123456")
    ]
    assert "ok buffered=0 max_frame_size=10" in repr(decoder)


def test_eof_inside_a_frame() -> None:
    decoder = FrameDecoder()
    assert feed(decoder, encode_frame(FrameType.RESPONSE, b"OK")[:5]) == []
    assert decoder.buffered == 5
    with pytest.raises(RemoteProtocolError, match="5 bytes pending"):
        decoder.feed_eof()


def test_limits() -> None:
    with pytest.raises(InvalidArgumentError):
        FrameDecoder(max_frame_size=3)
    assert max_frame_size_for(1048576) > 1048576 + 26 + 65535
    assert max_frame_size_for(4 * 1024 * 1024) == DEFAULT_MAX_FRAME_SIZE
    with pytest.raises(InvalidArgumentError):
        max_frame_size_for(0)


@settings(max_examples=300)
@given(st.binary(max_size=400), st.integers(4, 512))
def test_garbage_never_hangs_or_escapes(garbage: bytes, limit: int) -> None:
    decoder = FrameDecoder(max_frame_size=limit)
    try:
        for frame in feed(decoder, garbage):
            assert frame.frame_type in (0, 1, 2)
        assert decoder.buffered <= len(garbage)
    except NsqError:
        pass


def test_a_chunk_of_many_small_frames_is_compacted_and_keeps_a_cut_frame() -> None:
    # 20k pipelined OK answers arrive in large chunks; the decoder must not copy the rest of the
    # buffer after every frame, and a frame cut at the end of a chunk must survive compaction
    ok = encode_frame(FrameType.RESPONSE, b"OK")
    stream = ok * 20_000 + encode_frame(FrameType.ERROR, b"E_X tail")
    decoder = FrameDecoder()
    cut = len(stream) - 3
    first = feed(decoder, stream[:cut])
    assert len(first) == 20_000
    assert all(frame.data == b"OK" for frame in first)
    assert decoder.buffered == len(stream) - 20_000 * len(ok) - 3
    assert feed(decoder, stream[cut:]) == [Frame(FrameType.ERROR, b"E_X tail")]
    assert decoder.buffered == 0
    decoder.feed_eof()
