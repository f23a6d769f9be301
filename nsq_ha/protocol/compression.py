"""Incremental stream codecs for the compression upgrade (§1.8): snappy framing and raw deflate.

Both directions of a connection switch to the same format once nsqd agrees in the IDENTIFY
answer. Each codec here is sans-IO: ``compress(data)`` returns bytes ready for the wire (each
call's output is complete, so the peer can decode it at once) and ``decompress(data)`` accepts
any split of the incoming stream and returns plain bytes that are complete, at most
:data:`MAX_DECOMPRESSED_SLICE` per call: when more could be decoded from the input already
given, the codec's ``pending`` is true and ``decompress(b"")`` returns the next slice. A
compression bomb (a few KiB that inflate to hundreds of MiB) is thus decoded one bounded slice
at a time, and the reader above can stop at the first bad frame and let other tasks run
between slices.

* **snappy**: the framing format of ``github.com/golang/snappy`` ``NewWriter``/``NewReader``
  (the published snappy *framing_format.txt*): a stream identifier chunk
  ``ff 06 00 00 "sNaPpY"``, then chunks ``[u8 type][u24 little-endian length][body]`` where
  type 0x00 holds ``[u32 LE masked CRC-32C][snappy block]`` and 0x01 ``[u32 LE masked
  CRC-32C][raw bytes]``, each decoding to at most 65536 bytes; 0xfe is padding, 0x80..0xfd
  are skippable and 0x02..0x7f are reserved (an error). Chunk bodies are compressed and
  checked by python-snappy; the framing is read here.
* **deflate**: raw DEFLATE (no zlib header, ``wbits=-15``), every write ended with a sync
  flush so the peer can decode it without waiting for more.
"""

from __future__ import annotations

import zlib
from typing import Protocol

import snappy  # type: ignore[import-untyped]

from nsq_ha.errors import InvalidArgumentError, RemoteProtocolError

__all__ = [
    "MAX_DECOMPRESSED_SLICE",
    "MAX_SNAPPY_BLOCK",
    "SNAPPY_STREAM_IDENTIFIER",
    "DeflateCodec",
    "SnappyCodec",
    "StreamCodec",
    "iter_snappy_chunks",
]

#: The stream identifier chunk every snappy framed stream starts with.
SNAPPY_STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
#: Largest number of plain bytes one data chunk may decode to.
MAX_SNAPPY_BLOCK = 65536
#: Most plain bytes one ``decompress`` call returns.
MAX_DECOMPRESSED_SLICE = 4 * MAX_SNAPPY_BLOCK
_CHUNK_HEADER = 4
_CHUNK_COMPRESSED = 0x00
_CHUNK_UNCOMPRESSED = 0x01
_CHUNK_PADDING = 0xFE
_CHUNK_STREAM_ID = 0xFF
_FIRST_SKIPPABLE = 0x80
_CHECKSUM = 4
# The worst-case snappy encoding of a 64 KiB block (32 + n + n/6) plus the checksum.
_MAX_DATA_CHUNK = _CHECKSUM + 32 + MAX_SNAPPY_BLOCK + MAX_SNAPPY_BLOCK // 6
# Skippable and padding chunks are not bounded by the format; refuse absurd ones.
_MAX_SKIPPABLE_CHUNK = 1 << 20


class StreamCodec(Protocol):
    """What a connection needs from a compression codec."""

    name: str
    #: True when ``decompress(b"")`` may return more plain bytes from input already given.
    pending: bool

    def compress(self, data: bytes) -> bytes:
        """Return wire bytes for ``data``, flushed so the peer can decode them now."""
        ...

    def decompress(self, data: bytes) -> bytes:
        """Feed wire bytes; return at most :data:`MAX_DECOMPRESSED_SLICE` plain bytes now
        complete (possibly ``b""``)."""
        ...


def iter_snappy_chunks(
    buffer: bytearray, max_data_chunks: int | None = None
) -> list[tuple[int, bytes]]:
    """Remove complete chunks from the front of ``buffer`` and return ``(type, body)``: every
    one, or up to and including the ``max_data_chunks``-th data chunk.

    Bytes of an incomplete chunk stay in ``buffer``. Reserved chunk types and lengths no valid
    stream has raise RemoteProtocolError.
    """
    chunks: list[tuple[int, bytes]] = []
    position = 0
    data_chunks = 0
    while len(buffer) - position >= _CHUNK_HEADER:
        if max_data_chunks is not None and data_chunks >= max_data_chunks:
            break
        chunk_type = buffer[position]
        length = int.from_bytes(buffer[position + 1 : position + _CHUNK_HEADER], "little")
        if _CHUNK_UNCOMPRESSED < chunk_type < _FIRST_SKIPPABLE:
            raise RemoteProtocolError(f"snappy stream has a reserved chunk type 0x{chunk_type:02x}")
        if chunk_type in (_CHUNK_COMPRESSED, _CHUNK_UNCOMPRESSED):
            limit = _MAX_DATA_CHUNK if chunk_type == _CHUNK_COMPRESSED else _CHECKSUM + 65536
            if not _CHECKSUM <= length <= limit:
                raise RemoteProtocolError(
                    f"snappy data chunk of {length} bytes is outside {_CHECKSUM}..{limit}"
                )
        elif length > _MAX_SKIPPABLE_CHUNK:
            raise RemoteProtocolError(f"snappy chunk 0x{chunk_type:02x} of {length} bytes")
        end = position + _CHUNK_HEADER + length
        if end > len(buffer):
            break
        chunks.append((chunk_type, bytes(buffer[position + _CHUNK_HEADER : end])))
        position = end
        if chunk_type in (_CHUNK_COMPRESSED, _CHUNK_UNCOMPRESSED):
            data_chunks += 1
    del buffer[:position]
    return chunks


class SnappyCodec:
    """Snappy framed stream, both directions of one connection."""

    name = "snappy"

    def __init__(self) -> None:
        """Start a fresh stream in both directions."""
        self._compressor = snappy.StreamCompressor()
        self._decompressor = snappy.StreamDecompressor()
        self._buffer = bytearray()
        self._seen_identifier = False
        self.pending = False

    def __repr__(self) -> str:
        """Show how many received bytes wait for the rest of their chunk."""
        return f"<SnappyCodec buffered={len(self._buffer)}>"

    def compress(self, data: bytes) -> bytes:
        """Frame ``data`` (the first call also writes the stream identifier)."""
        if not data:
            return b""
        return bytes(self._compressor.compress(data))

    def decompress(self, data: bytes) -> bytes:
        """Feed framed bytes; return the plain bytes of the chunks now complete, at most
        :data:`MAX_DECOMPRESSED_SLICE` (``pending`` tells whether more chunks wait)."""
        self._buffer += data
        complete: list[bytes] = []
        limit = MAX_DECOMPRESSED_SLICE // MAX_SNAPPY_BLOCK
        chunks = iter_snappy_chunks(self._buffer, limit)
        self.pending = (
            sum(t in (_CHUNK_COMPRESSED, _CHUNK_UNCOMPRESSED) for t, _ in chunks) >= limit
        )
        for chunk_type, body in chunks:
            if chunk_type == _CHUNK_STREAM_ID:
                if body != SNAPPY_STREAM_IDENTIFIER[_CHUNK_HEADER:]:
                    raise RemoteProtocolError(f"bad snappy stream identifier {body!r}")
                self._seen_identifier = True
            elif not self._seen_identifier:
                raise RemoteProtocolError("snappy stream does not start with its identifier")
            elif chunk_type in (_CHUNK_COMPRESSED, _CHUNK_UNCOMPRESSED):
                header = bytes((chunk_type,)) + len(body).to_bytes(3, "little")
                complete.append(header + body)
            # padding and skippable chunks carry nothing
        if not complete:
            return b""
        try:
            # python-snappy checks each chunk's CRC-32C and decodes the block
            stream = SNAPPY_STREAM_IDENTIFIER + b"".join(complete)
            return bytes(self._decompressor.decompress(stream))
        except Exception as exc:  # snappy raises OSError or its own UncompressError
            raise RemoteProtocolError(f"corrupt snappy stream: {exc}") from exc


class DeflateCodec:
    """Raw DEFLATE stream (``wbits=-15``) with a sync flush after every write."""

    name = "deflate"

    def __init__(self, level: int = 6) -> None:
        """Compress at ``level`` (0..9, what nsqd negotiated)."""
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 9:
            raise InvalidArgumentError(f"deflate level must be an int in 0..9, got {level!r}")
        self.level = level
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._decompressor = zlib.decompressobj(-15)
        self.pending = False

    def __repr__(self) -> str:
        """Show the level."""
        return f"<DeflateCodec level={self.level}>"

    def compress(self, data: bytes) -> bytes:
        """Compress ``data`` and sync-flush."""
        if not data:
            return b""
        return self._compressor.compress(data) + self._compressor.flush(zlib.Z_SYNC_FLUSH)

    def decompress(self, data: bytes) -> bytes:
        """Feed raw DEFLATE bytes; return what they decode to, at most
        :data:`MAX_DECOMPRESSED_SLICE` (the rest waits: ``pending``)."""
        decompressor = self._decompressor
        if decompressor.eof:
            if not data and not decompressor.unused_data:
                self.pending = False
                return b""
            raise RemoteProtocolError("deflate stream already ended")
        tail = decompressor.unconsumed_tail
        if tail:
            data = tail + data
        try:
            plain = decompressor.decompress(data, MAX_DECOMPRESSED_SLICE)
        except zlib.error as exc:
            raise RemoteProtocolError(f"corrupt deflate stream: {exc}") from exc
        # a full slice may leave output inside zlib even when all input was consumed
        self.pending = bool(decompressor.unconsumed_tail) or len(plain) >= MAX_DECOMPRESSED_SLICE
        return plain
