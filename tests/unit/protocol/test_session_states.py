"""The client connection state tables (nsq_ha.protocol.session), and the session's moves."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import LocalProtocolError
from nsq_ha.protocol.commands import (
    Auth,
    Cls,
    Command,
    Fin,
    Identify,
    Nop,
    Rdy,
    Req,
    Sub,
    SubOrdered,
    Touch,
)
from nsq_ha.protocol.publish import Publish, PublishMessage
from nsq_ha.protocol.session import COMMANDS_BY_STATE, TRANSITIONS, ClientSession, ConnState

S = ConnState
ID = b"0123456789abcdef"
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
        (S.CONNECTED, Identify.of({})),
        (S.AUTHENTICATING, Auth.of("s")),
        (S.READY, Publish(b"PUB", "t", None, [PublishMessage(b"x")])),
        (S.READY, SubOrdered("t", "c", 0)),
        (S.SUBSCRIBED, Rdy(1)),
        (S.SUBSCRIBED, Cls()),
        (S.SUBSCRIBED, Fin(ID)),
        (S.CLOSING, Req(ID)),
        (S.CLOSE_WAIT, Touch(ID)),
        (S.CLOSE_WAIT, Nop()),
    ],
)
def test_allowed_commands(state: ConnState, command: Command) -> None:
    """Commands nsqd accepts in the matching server state pass the check."""
    in_state(state)._allowed(command.name)


@pytest.mark.parametrize(
    ("state", "command"),
    [
        (S.INIT, Nop()),
        (S.READY, Rdy(1)),  # nsqd: E_INVALID cannot RDY in current state (fatal)
        (S.READY, Fin(ID)),
        (S.READY, Cls()),
        (S.READY, Identify.of({})),
        (S.SUBSCRIBED, Sub("t", "c")),  # only one SUB per connection
        (S.SUBSCRIBING, Sub("t", "c")),
        (S.CLOSING, Cls()),
        (S.CLOSED, Nop()),
        (S.TLS_UPGRADE, Nop()),
    ],
)
def test_refused_commands(state: ConnState, command: Command) -> None:
    """Commands nsqd would refuse (fatally) in that state never leave the client."""
    with pytest.raises(LocalProtocolError, match=f"cannot send .* in state {state.name}"):
        in_state(state)._allowed(command.name)


def test_fin_with_binary_id_is_named_by_its_prefix() -> None:
    """A fork id may hold spaces and newlines; the command is still a FIN."""
    message_id = b"\n \x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d"
    assert in_state(S.SUBSCRIBED).send_nowait(Fin(message_id)) == b"FIN " + message_id + b"\n"


def test_publish_allowed_until_closed() -> None:
    """Publishing never changes the server state and works in every open post-handshake state."""
    open_states = [S.READY, S.SUBSCRIBING, S.SUBSCRIBED, S.CLOSING, S.CLOSE_WAIT]
    for state, name in itertools.product(open_states, [b"PUB", b"MPUB", b"PUB_TRACE"]):
        assert name in COMMANDS_BY_STATE[state]
