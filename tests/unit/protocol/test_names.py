"""Topic, channel, partition and message-id rules."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import InvalidArgumentError, InvalidNameError
from nsq_ha.protocol import (
    validate_channel,
    validate_message_id,
    validate_partition,
    validate_topic,
)
from nsq_ha.protocol.names import is_valid_name

GO_RULE = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?$")


@pytest.mark.parametrize(
    "name",
    ["t", "cf_pubsub", "a.b-c_d", "x" * 64, "ch#ephemeral", "y" * 54 + "#ephemeral", "...", "-"],
)
def test_valid_names(name: str) -> None:
    assert validate_topic(name) == name
    assert validate_channel(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x" * 65,
        "y" * 55 + "#ephemeral",
        "bad!topic",
        "has space",
        "new\nline",
        "trailing\n",
        "#ephemeral",
        "a#ephemeral#ephemeral",
        "a#other",
        "ünïcode",
        "tab\t",
    ],
)
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidNameError, match="topic name"):
        validate_topic(name)
    with pytest.raises(InvalidNameError, match="channel name"):
        validate_channel(name)


def test_names_must_be_str() -> None:
    with pytest.raises(InvalidNameError, match="must be a str"):
        validate_topic(b"topic")


@given(st.text(alphabet=st.characters(codec="ascii"), max_size=70))
def test_name_rule_matches_the_go_regexp_and_length(name: str) -> None:
    expected = GO_RULE.match(name) is not None and 1 <= len(name) <= 64 and "\n" not in name
    assert is_valid_name(name) is expected


@pytest.mark.parametrize("partition", [None, -1, 0, 1, 254])
def test_valid_partitions(partition: int | None) -> None:
    assert validate_partition(partition) == partition


@pytest.mark.parametrize("partition", [-2, 255, 1024, True, "1", 1.0])
def test_invalid_partitions(partition: object) -> None:
    with pytest.raises(InvalidArgumentError, match="partition"):
        validate_partition(partition)


def test_message_ids() -> None:
    fork_id = bytes([0, 0, 0, 0, 0, 0, 0, 10]) + bytes(8)
    assert validate_message_id(fork_id) == fork_id
    assert validate_message_id(bytearray(b"18a33cc8cb001000")) == b"18a33cc8cb001000"
    assert validate_message_id(memoryview(b" \n" * 8)) == b" \n" * 8
    with pytest.raises(InvalidArgumentError, match="16 bytes, got 5"):
        validate_message_id(b"12345")
    with pytest.raises(InvalidArgumentError, match="must be bytes"):
        validate_message_id("0123456789abcdef")
    with pytest.raises(InvalidArgumentError, match="internal id <= 0"):
        validate_message_id(bytes(16))
    with pytest.raises(InvalidArgumentError, match="internal id <= 0"):
        validate_message_id(b"\xff" * 16)
