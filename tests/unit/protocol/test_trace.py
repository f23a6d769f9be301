"""The 30-byte traced publish response."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import InvalidArgumentError, NsqError, RemoteProtocolError
from nsq_ha.protocol import TracedResponse, parse_traced_response
from nsq_ha.protocol.broker import encode_traced_response

u64 = st.integers(0, (1 << 64) - 1)


def test_recorded_response() -> None:
    data = bytes.fromhex("4f4b00000000000000021122334455667788000000000000000000000022")
    response = parse_traced_response(data)
    assert response == TracedResponse(2, 0x1122334455667788, 0, 34)
    assert response.message_id == bytes.fromhex("00000000000000021122334455667788")


@given(u64, u64, u64, st.integers(0, (1 << 32) - 1))
def test_round_trip(internal_id: int, trace_id: int, offset: int, raw_size: int) -> None:
    response = TracedResponse(internal_id, trace_id, offset, raw_size)
    data = encode_traced_response(response)
    assert len(data) == 30
    assert parse_traced_response(data) == response


@pytest.mark.parametrize(
    "data", [b"OK", b"", b"NO" + bytes(28), b"OK" + bytes(29), b"OK" + bytes(27)]
)
def test_not_traced(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError, match="30-byte traced response"):
        parse_traced_response(data)


def test_out_of_range_fields() -> None:
    with pytest.raises(InvalidArgumentError):
        encode_traced_response(TracedResponse(-1, 0, 0, 0))
    with pytest.raises(InvalidArgumentError):
        encode_traced_response(TracedResponse(0, 0, 0, 1 << 32))


@given(st.binary(max_size=40))
def test_garbage(data: bytes) -> None:
    try:
        parse_traced_response(data)
    except NsqError:
        assert len(data) != 30 or not data.startswith(b"OK")
