"""The client connection state tables (nsq_ha.protocol.state), and the session's moves."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import LocalProtocolError
from nsq_ha.protocol.session import ClientSession
from nsq_ha.protocol.state import (
    COMMANDS_BY_STATE,
    TRANSITIONS,
    ConnState,
    check_command,
    command_name,
)

S = ConnState
HAPPY_PATHS = [
    [S.CONNECTED, S.IDENTIFYING, S.READY, S.SUBSCRIBING, S.SUBSCRIBED, S.CLOSING, S.CLOSE_WAIT],
    [S.CONNECTED, S.IDENTIFYING, S.TLS_UPGRADE, S.COMPRESSION_UPGRADE, S.AUTHENTICATING, S.READY],
    [S.CONNECTED, S.IDENTIFYING, S.COMPRESSION_UPGRADE, S.READY],
    [S.CONNECTED, S.IDENTIFYING, S.AUTHENTICATING, S.READY, S.SUBSCRIBING, S.READY],
]


def test_every_state_has_a_row() -> None:
    """The transition and command tables cover every state."""
    assert set(TRANSITIONS) == set(ConnState)
    assert set(COMMANDS_BY_STATE) == set(ConnState)


def in_state(state: ConnState) -> ClientSession:
    session = ClientSession()
    session.state = state
    return session


@pytest.mark.parametrize("path", HAPPY_PATHS)
def test_happy_paths_then_closed(path: list[ConnState]) -> None:
    """The documented handshake and subscribe paths are legal and end in CLOSED."""
    for before, after in zip([S.INIT, *path], [*path, S.CLOSED], strict=True):
        assert after in TRANSITIONS[before]


@pytest.mark.parametrize("state", [s for s in ConnState if s is not S.CLOSED])
def test_closed_reachable_from_everywhere_but_leads_nowhere(state: ConnState) -> None:
    """Either side may close at any time; nothing follows CLOSED."""
    session = in_state(state)
    session.close()
    assert session.closed
    for target in ConnState:
        with pytest.raises(LocalProtocolError, match="CLOSED -> "):
            session._move(target)


@given(st.sampled_from(list(ConnState)), st.sampled_from(list(ConnState)))
def test_a_move_agrees_with_the_table(start: ConnState, target: ConnState) -> None:
    """Any (state, target) pair: the session moves exactly when the table allows it."""
    session = in_state(start)
    if target in TRANSITIONS[start]:
        session._move(target)
        assert session.state is target
    else:
        with pytest.raises(LocalProtocolError, match=f"{start.name} -> {target.name}"):
            session._move(target)
        assert session.state is start


@pytest.mark.parametrize(
    ("skipped_from", "skipped_to"),
    [
        (S.INIT, S.READY),
        (S.READY, S.SUBSCRIBED),
        (S.SUBSCRIBED, S.CLOSE_WAIT),
        (S.READY, S.CLOSING),
    ],
)
def test_skipping_a_step_is_refused(skipped_from: ConnState, skipped_to: ConnState) -> None:
    """No handshake, SUB answer or CLS can be skipped."""
    assert skipped_to not in TRANSITIONS[skipped_from]


@pytest.mark.parametrize(
    ("state", "command"),
    [
        (S.CONNECTED, b"IDENTIFY\n\x00\x00\x00\x02{}"),
        (S.AUTHENTICATING, b"AUTH\n\x00\x00\x00\x01s"),
        (S.READY, b"PUB t\n\x00\x00\x00\x01x"),
        (S.READY, b"SUB_ORDERED t c 0\n"),
        (S.SUBSCRIBED, b"RDY 1\n"),
        (S.SUBSCRIBED, b"CLS\n"),
        (S.SUBSCRIBED, b"FIN 0123456789abcdef\n"),
        (S.CLOSING, b"REQ 0123456789abcdef 0\n"),
        (S.CLOSE_WAIT, b"TOUCH 0123456789abcdef\n"),
        (S.CLOSE_WAIT, b"NOP\n"),
    ],
)
def test_allowed_commands(state: ConnState, command: bytes) -> None:
    """Commands nsqd accepts in the matching server state pass the check."""
    assert check_command(state, command) == command_name(command)


@pytest.mark.parametrize(
    ("state", "command"),
    [
        (S.INIT, b"NOP\n"),
        (S.READY, b"RDY 1\n"),  # nsqd: E_INVALID cannot RDY in current state (fatal)
        (S.READY, b"FIN 0123456789abcdef\n"),
        (S.READY, b"CLS\n"),
        (S.READY, b"IDENTIFY\n"),
        (S.SUBSCRIBED, b"SUB t c\n"),  # only one SUB per connection
        (S.SUBSCRIBING, b"SUB t c\n"),
        (S.CLOSING, b"CLS\n"),
        (S.CLOSED, b"NOP\n"),
        (S.TLS_UPGRADE, b"NOP\n"),
        (S.READY, b""),
    ],
)
def test_refused_commands(state: ConnState, command: bytes) -> None:
    """Commands nsqd would refuse (fatally) in that state never leave the client."""
    with pytest.raises(LocalProtocolError, match=f"in state {state.name}"):
        check_command(state, command)


def test_fin_with_binary_id_is_named_by_its_prefix() -> None:
    """A fork id may hold spaces and newlines; the name is still FIN."""
    assert (
        command_name(b"FIN \n \x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\n") == b"FIN"
    )


def test_publish_allowed_until_closed() -> None:
    """Publishing never changes the server state and works in every open post-handshake state."""
    open_states = [S.READY, S.SUBSCRIBING, S.SUBSCRIBED, S.CLOSING, S.CLOSE_WAIT]
    for state, name in itertools.product(open_states, [b"PUB", b"MPUB", b"PUB_TRACE"]):
        assert name in COMMANDS_BY_STATE[state]
