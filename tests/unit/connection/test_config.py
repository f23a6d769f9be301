"""ConnectionConfig refuses every meaningless duration with ConfigError."""

from __future__ import annotations

import math

import pytest

from nsq_ha.connection import ConnectionConfig
from nsq_ha.connection.config import parse_address
from nsq_ha.errors import ConfigError

#: Every duration option (seconds) and whether ``-1`` is nsqd's documented "off" value for it.
DURATIONS = {
    "heartbeat_interval": True,
    "output_buffer_timeout": True,
    "msg_timeout": False,
    "connect_timeout": False,
    "command_timeout": False,
    "close_timeout": False,
}
BAD = [math.nan, -math.nan, math.inf, -math.inf, -5.0, -0.5, 0, 1e300, 2**70, "5", True]


@pytest.mark.parametrize("name", list(DURATIONS))
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_every_duration_refuses_nan_infinity_negative_and_absurd(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=name):
        ConnectionConfig(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(DURATIONS))
def test_minus_one_is_off_only_where_nsqd_says_so(name: str) -> None:
    if DURATIONS[name]:
        assert getattr(ConnectionConfig(**{name: -1}), name) == -1  # type: ignore[arg-type]
    else:
        with pytest.raises(ConfigError, match=name):
            ConnectionConfig(**{name: -1})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(DURATIONS))
def test_a_sane_duration_is_kept(name: str) -> None:
    assert getattr(ConnectionConfig(**{name: 2.5}), name) == 2.5  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("address", "expected"),
    [("127.0.0.1:4150", ("127.0.0.1", 4150)), ("[::1]:4150", ("::1", 4150)), (("h", 1), ("h", 1))],
)
def test_parse_address_accepts_host_port(
    address: str | tuple[str, int], expected: tuple[str, int]
) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["nohost", ":4150", "h:0", "h:65536", "h:x", ("h", 0)])
def test_parse_address_refuses_anything_else(address: str | tuple[str, int]) -> None:
    with pytest.raises(ConfigError, match="host:port"):
        parse_address(address)
