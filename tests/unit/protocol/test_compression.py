"""Stream codecs of the compression upgrade (nsq_ha.protocol.compression).

The snappy tests check the bytes against the framing format that golang/snappy's
NewWriter/NewReader use (stream identifier, chunk headers, masked CRC-32C computed here
independently), so a Go peer can read what we write and we can read what it writes.
"""

from __future__ import annotations

import os
import zlib

import pytest
import snappy  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_ha.errors import InvalidArgumentError, RemoteProtocolError
from nsq_ha.protocol.compression import (
    MAX_DECOMPRESSED_SLICE,
    MAX_SNAPPY_BLOCK,
    SNAPPY_STREAM_IDENTIFIER,
    DeflateCodec,
    SnappyCodec,
    iter_snappy_chunks,
)


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bit by bit: slow, obviously correct."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    """The snappy framing mask: rotate right 15, add a constant."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _chunk(chunk_type: int, body: bytes) -> bytes:
    return bytes((chunk_type,)) + len(body).to_bytes(3, "little") + body


def _go_uncompressed_chunk(data: bytes) -> bytes:
    """An uncompressed data chunk exactly as golang/snappy's writer builds it."""
    return _chunk(0x01, _masked(_crc32c(data)).to_bytes(4, "little") + data)


def _go_compressed_chunk(data: bytes) -> bytes:
    """A compressed data chunk: masked CRC of the plain bytes, then the snappy block."""
    block = snappy.compress(data)
    return _chunk(0x00, _masked(_crc32c(data)).to_bytes(4, "little") + block)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    return pieces


def test_crc_helper_matches_the_published_check_value() -> None:
    """The test's own CRC-32C gives the standard check value for '123456789'."""
    assert _crc32c(b"123456789") == 0xE3069283


def test_snappy_writes_stream_identifier_once_then_go_style_chunks() -> None:
    """Our stream starts ff 06 00 00 sNaPpY, once; every chunk has a valid masked CRC-32C."""
    codec = SnappyCodec()
    first = codec.compress(b"PUB topic\n\x00\x00\x00\x05hello")
    second = codec.compress(b"NOP\n")
    assert first.startswith(SNAPPY_STREAM_IDENTIFIER)
    assert SNAPPY_STREAM_IDENTIFIER not in second
    buffer = bytearray(first + second)
    chunks = iter_snappy_chunks(buffer)
    assert not buffer
    assert chunks[0] == (0xFF, b"sNaPpY")
    plain = b""
    for chunk_type, body in chunks[1:]:
        assert chunk_type in (0x00, 0x01)
        data = body[4:] if chunk_type == 0x01 else snappy.uncompress(body[4:])
        assert int.from_bytes(body[:4], "little") == _masked(_crc32c(data))
        plain += data
    assert plain == b"PUB topic\n\x00\x00\x00\x05helloNOP\n"


def test_snappy_blocks_never_exceed_64k() -> None:
    """Go's reader refuses chunks decoding to more than 65536 bytes; we never write one."""
    data = os.urandom(200_000)  # incompressible: forces uncompressed chunks
    buffer = bytearray(SnappyCodec().compress(data) + SnappyCodec().compress(b"x" * 200_000))
    for chunk_type, body in iter_snappy_chunks(buffer):
        if chunk_type == 0x01:
            assert len(body) - 4 <= MAX_SNAPPY_BLOCK
        elif chunk_type == 0x00:
            assert len(snappy.uncompress(body[4:])) <= MAX_SNAPPY_BLOCK


def test_snappy_reads_a_go_writer_stream_with_padding_and_skippable_chunks() -> None:
    """A stream built by the Go rules (both data chunk kinds, 0xfe padding, 0x80 skippable,
    a repeated identifier) decodes to the plain bytes."""
    stream = (
        SNAPPY_STREAM_IDENTIFIER
        + _go_compressed_chunk(b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * 40)
        + _chunk(0xFE, b"\x00" * 7)
        + _chunk(0x80, b"ignore me")
        + SNAPPY_STREAM_IDENTIFIER
        + _go_uncompressed_chunk(b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_")
    )
    expected = b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * 40 + (
        b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    )
    assert SnappyCodec().decompress(stream) == expected


@settings(max_examples=60)
@given(st.binary(min_size=1, max_size=3000), st.lists(st.integers(0, 10_000), max_size=8))
def test_snappy_any_split_gives_the_same_bytes(data: bytes, cuts: list[int]) -> None:
    """Feeding the framed stream in arbitrary pieces yields exactly the original bytes."""
    sender, receiver = SnappyCodec(), SnappyCodec()
    wire = sender.compress(data) + sender.compress(data[::-1])
    out = b"".join(receiver.decompress(piece) for piece in _split(wire, cuts))
    assert out == data + data[::-1]


def test_snappy_byte_at_a_time() -> None:
    """One byte per call: nothing comes out before a chunk completes, then all of it."""
    wire = SnappyCodec().compress(b"hello world")
    receiver = SnappyCodec()
    outputs = [receiver.decompress(wire[i : i + 1]) for i in range(len(wire))]
    assert outputs[:-1] == [b""] * (len(wire) - 1)
    assert outputs[-1] == b"hello world"
    assert repr(receiver) == "<SnappyCodec buffered=0>"


def test_snappy_empty_write_writes_nothing() -> None:
    """compress(b'') produces no chunk (and no premature identifier)."""
    assert SnappyCodec().compress(b"") == b""


@pytest.mark.parametrize(
    ("stream", "match"),
    [
        (SNAPPY_STREAM_IDENTIFIER + _chunk(0x02, b"x"), "reserved chunk type 0x02"),
        (SNAPPY_STREAM_IDENTIFIER + _chunk(0x7F, b""), "reserved chunk type 0x7f"),
        (_go_uncompressed_chunk(b"abc"), "does not start with its identifier"),
        (_chunk(0xFF, b"sNaPpX"), "bad snappy stream identifier"),
        (SNAPPY_STREAM_IDENTIFIER + _chunk(0x01, b"ab"), "outside 4"),
        (SNAPPY_STREAM_IDENTIFIER + b"\x00\xff\xff\xff", "outside 4"),
        (SNAPPY_STREAM_IDENTIFIER + b"\xfe\xff\xff\xff", "chunk 0xfe of"),
    ],
)
def test_snappy_refuses_malformed_streams(stream: bytes, match: str) -> None:
    """Reserved types, a missing identifier and impossible lengths are protocol errors."""
    with pytest.raises(RemoteProtocolError, match=match):
        SnappyCodec().decompress(stream)


def test_snappy_refuses_a_bad_checksum() -> None:
    """A flipped CRC bit is caught (the peer's data was corrupted)."""
    good = _go_uncompressed_chunk(b"payload")
    bad = good[:4] + bytes((good[4] ^ 1,)) + good[5:]
    with pytest.raises(RemoteProtocolError, match="corrupt snappy stream"):
        SnappyCodec().decompress(SNAPPY_STREAM_IDENTIFIER + bad)


@settings(max_examples=60)
@given(st.binary(min_size=0, max_size=3000), st.lists(st.integers(0, 10_000), max_size=8))
def test_deflate_any_split_gives_the_same_bytes(data: bytes, cuts: list[int]) -> None:
    """Raw deflate with sync flush: each write decodes completely, for any split."""
    sender, receiver = DeflateCodec(6), DeflateCodec(6)
    first = sender.compress(data)
    second = sender.compress(b"NOP\n")
    assert second.endswith(b"\x00\x00\xff\xff")  # sync flush marker: decodable right away
    out = b"".join(receiver.decompress(piece) for piece in _split(first + second, cuts))
    assert out == data + b"NOP\n"


def test_deflate_is_raw_and_reads_what_zlib_writes_like_go() -> None:
    """No zlib header on the wire; a raw stream written like Go's flate writer decodes."""
    wire = DeflateCodec(1).compress(b"hello")
    assert zlib.decompressobj(-15).decompress(wire) == b"hello"
    go_like = zlib.compressobj(6, zlib.DEFLATED, -15)
    stream = go_like.compress(b"OK" * 100) + go_like.flush(zlib.Z_SYNC_FLUSH)
    assert DeflateCodec(6).decompress(stream) == b"OK" * 100
    assert repr(DeflateCodec(3)) == "<DeflateCodec level=3>"


def test_deflate_errors() -> None:
    """Bad levels are refused; garbage and data after the final block are protocol errors."""
    for level in (-1, 10, True, 1.5):
        with pytest.raises(InvalidArgumentError):
            DeflateCodec(level)  # type: ignore[arg-type]
    with pytest.raises(RemoteProtocolError, match="corrupt deflate"):
        DeflateCodec().decompress(b"\xff\xff\xff\xff")
    ended = DeflateCodec()
    ended.decompress(zlib.compress(b"x")[2:-4])  # a complete raw stream with a final block
    assert ended.decompress(b"") == b""  # nothing pending after the end: no error
    with pytest.raises(RemoteProtocolError, match="already ended"):
        ended.decompress(b"more")
    assert DeflateCodec().compress(b"") == b""


# -- bounded slices: a compression bomb comes out a slice at a time ----------------------------


def _drain(codec: DeflateCodec | SnappyCodec, wire: bytes) -> list[bytes]:
    """Feed ``wire`` once, then ``decompress(b"")`` while ``pending``; return every output."""
    outputs = [codec.decompress(wire)]
    for _ in range(100_000):
        if not codec.pending:
            break
        outputs.append(codec.decompress(b""))
    assert not codec.pending
    return outputs


def test_a_deflate_bomb_comes_out_in_bounded_slices() -> None:
    """64 KiB of deflate that inflate to 64 MiB: no call returns more than one slice, and the
    slices add up to the whole stream."""
    plain = bytes(64 * 1024 * 1024)
    go_like = zlib.compressobj(9, zlib.DEFLATED, -15)
    wire = go_like.compress(plain) + go_like.flush(zlib.Z_SYNC_FLUSH)
    assert len(wire) < 128 * 1024
    outputs = _drain(DeflateCodec(), wire)
    assert max(len(o) for o in outputs) <= MAX_DECOMPRESSED_SLICE
    assert sum(len(o) for o in outputs) == len(plain)
    assert all(o == bytes(len(o)) for o in outputs)


def test_snappy_chunks_come_out_in_bounded_slices() -> None:
    """Twenty 64 KiB chunks in one read: at most four chunks per call."""
    plain = os.urandom(20 * MAX_SNAPPY_BLOCK)
    wire = SnappyCodec().compress(plain)
    outputs = _drain(SnappyCodec(), wire)
    assert max(len(o) for o in outputs) <= MAX_DECOMPRESSED_SLICE
    assert len(outputs) >= 5
    assert b"".join(outputs) == plain


@settings(max_examples=40, deadline=None)
@given(
    codec=st.sampled_from(["deflate", "snappy"]),
    size=st.integers(0, 3 * MAX_DECOMPRESSED_SLICE),
    cuts=st.lists(st.integers(0, 400_000), max_size=6),
    drains=st.lists(st.integers(0, 3), max_size=8),
)
def test_slices_keep_the_stream_whatever_the_interleaving(
    codec: str, size: int, cuts: list[int], drains: list[int]
) -> None:
    """New input fed while earlier input is still pending comes out after it, in order."""
    plain = (b"nsq" * (size // 3 + 1))[:size] + os.urandom(min(size, 1000))
    sender = DeflateCodec(6) if codec == "deflate" else SnappyCodec()
    receiver = DeflateCodec(6) if codec == "deflate" else SnappyCodec()
    wire = sender.compress(plain)
    out = []
    for index, piece in enumerate(_split(wire, cuts)):
        out.append(receiver.decompress(piece))
        for _ in range(drains[index] if index < len(drains) else 0):
            out.append(receiver.decompress(b""))
    out.extend(_drain(receiver, b""))
    assert all(len(o) <= MAX_DECOMPRESSED_SLICE for o in out)
    assert b"".join(out) == plain


def test_the_deflate_codecs_default_level_is_the_connections() -> None:
    """The codec cannot read the connection's settings (the layer above it), nor they the
    codec's (the client loads this module, and python-snappy, only once nsqd agreed to
    compress): the codec's own default is held equal to
    :data:`~nsq_ha.connection.config.DEFAULT_DEFLATE_LEVEL` here."""
    from nsq_ha.connection.config import DEFAULT_DEFLATE_LEVEL

    assert DeflateCodec().level == DEFAULT_DEFLATE_LEVEL
