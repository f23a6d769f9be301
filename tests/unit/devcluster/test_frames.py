"""The embedded broker's packed message frame (its delivery hot path) is byte for byte the
general encoder's, in every message format, and the command decoder's FIN shortcut gives the
command the general path gives (binary fork ids may hold a newline byte)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from nsq_ha.devcluster.nsqd.output import message_frame
from nsq_ha.devcluster.store import StoredMessage
from nsq_ha.protocol.broker import encode_message
from nsq_ha.protocol.command_decoder import ClientCommand, CommandDecoder
from nsq_ha.protocol.frames import FrameType, encode_frame
from nsq_ha.protocol.message import DecodedMessage, MessageFormat

U64 = st.integers(0, 2**64 - 1)
FORMATS = [
    MessageFormat(),
    MessageFormat(detail=True),
    MessageFormat(ext=True),
    MessageFormat(ext=True, detail=True),
]


@settings(max_examples=300)
@given(
    internal_id=U64,
    trace_id=U64,
    offset=st.integers(0, 2**63 - 1),
    raw_size=st.integers(0, 2**32 - 1),
    timestamp=st.integers(0, 2**63 - 1),
    attempts=st.integers(0, 2**16 - 1),
    body=st.binary(min_size=1, max_size=64),
    ext_data=st.binary(max_size=16),
    fmt=st.sampled_from(FORMATS),
)
def test_the_packed_frame_is_the_encoders(
    internal_id: int,
    trace_id: int,
    offset: int,
    raw_size: int,
    timestamp: int,
    attempts: int,
    body: bytes,
    ext_data: bytes,
    fmt: MessageFormat,
) -> None:
    stored = StoredMessage(
        internal_id,
        trace_id,
        offset,
        raw_size,
        timestamp,
        body,
        ext_version=1 if ext_data else 0,
        ext_data=ext_data,
    )
    general = encode_frame(
        FrameType.MESSAGE,
        encode_message(
            DecodedMessage(
                timestamp=timestamp,
                attempts=attempts,
                id=stored.id,
                body=body,
                ext_version=stored.ext_version,
                ext_data=ext_data,
                offset=offset,
                raw_size=raw_size,
            ),
            fmt,
        ),
    )
    assert message_frame(stored, attempts, fmt) == general


@given(
    ids=st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=5),
    piece=st.integers(1, 30),
)
@example(ids=[b"\n" * 16, b"0123456789abcde\n", b"FIN " * 4], piece=21)
def test_fin_is_decoded_whole_and_in_pieces(ids: list[bytes], piece: int) -> None:
    data = b"  V2" + b"".join(b"FIN " + i + b"\n" for i in ids) + b"RDY 5\n"
    want = [*((b"FIN", (i,)) for i in ids), (b"RDY", (b"5",))]
    for size in (len(data), piece):  # all at once, and in pieces of ``piece`` bytes
        decoder = CommandDecoder()
        events = []
        for start in range(0, len(data), size):
            events += decoder.feed(data[start : start + size])
        got = [(e.name, e.params) for e in events if isinstance(e, ClientCommand)]
        assert got == want
