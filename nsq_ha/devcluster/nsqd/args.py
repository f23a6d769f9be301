"""Command arguments as the emulated nsqd parses them: Go's number parsing and error texts.

Functions of the command tokens (PROTOCOL.md §2): the partition token, which nsqd reads only
when the line has its exact token count, the ``SUB_ADVANCED`` start position, and the checks of
a SUB in the fork's order (§2.3), which ask the cluster where the partition is.
"""

from __future__ import annotations

from dataclasses import dataclass

from nsq_ha.protocol.command_decoder import ClientCommand
from nsq_ha.protocol.names import is_valid_name

from ..http import go_atoi
from ..model import ChannelHub, DevNode, DevPartition, ServerError
from ..store import NotOwnedError
from ..view import ClusterView

__all__ = [
    "Sub",
    "apply_start",
    "go_bytes",
    "not_in_flight",
    "parse_atoi",
    "parse_message_id",
    "parse_req_delay",
    "parse_start",
    "partition_token",
    "read_sub",
    "refused",
]

#: the kinds of a ``SUB_ADVANCED`` start position (§2.3.1)
START_KINDS = ("special", "virtual_queue", "timestamp", "msgcount")


def go_bytes(data: bytes) -> str:
    """``data`` as Go prints a byte slice: ``[70 79 79]``."""
    return "[" + " ".join(str(b) for b in data) + "]"


def parse_atoi(token: bytes) -> int:
    """Go ``strconv.Atoi`` of a command token; ValueError with Go's message on failure."""
    return go_atoi(token.decode("latin-1"))


def partition_token(params: tuple[bytes, ...], count: int) -> int:
    """The partition argument: parsed only when the line has exactly ``count`` tokens."""
    if len(params) + 1 != count:
        return -1
    try:
        return parse_atoi(params[count - 2])
    except ValueError as exc:
        raise ServerError("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None


def parse_message_id(params: tuple[bytes, ...], what: str) -> tuple[bytes, int]:
    """The 16-byte message id of FIN/REQ/TOUCH and its internal id (the first 8 bytes)."""
    if not params:
        raise ServerError("E_INVALID", f"{what} insufficient number of params")
    message_id = params[0]
    internal_id = int.from_bytes(message_id[:8], "big", signed=True)
    # only FIN refuses a non-positive internal id; REQ/TOUCH just find nothing in flight
    if len(message_id) != 16 or (what == "FIN" and internal_id <= 0):
        raise ServerError("E_INVALID", "Invalid Message ID")
    return message_id, internal_id


def parse_req_delay(params: tuple[bytes, ...], max_req_timeout: float) -> float:
    """REQ's delay in seconds (milliseconds on the wire, capped at ``max_req_timeout``)."""
    if len(params) < 2:
        raise ServerError("E_INVALID", "REQ insufficient number of params")
    raw = params[1].decode("latin-1")
    if not raw.isascii() or not raw.isdigit():
        # nsqd's text carries the raw id bytes, then the token
        raw_id = params[0].decode("utf-8", "surrogateescape")
        raise ServerError("E_INVALID", f"REQ could not parse timeout {raw_id}, {raw}")
    return min(int(raw) / 1000, max_req_timeout)


def not_in_flight(
    what: str, message_id: bytes, reason: str = "Message ID not in flight"
) -> ServerError:
    """The non-fatal error of a FIN/REQ/TOUCH whose message this client does not hold."""
    prefix = "ErrType:7 ErrCode:0 : " if what == "FIN" else ""
    return ServerError(
        f"E_{what}_FAILED", f"{what} {go_bytes(message_id)} failed {prefix}{reason}", fatal=False
    )


def refused(
    what: str, message_id: bytes, error: KeyError, me: int, *, delayed: bool = False
) -> ServerError:
    """The error of a FIN/REQ/TOUCH the channel refused with ``error``: not in flight, in
    flight for another client (nsqd prints both client numbers; a deferred message's holder
    is 0), or, for a REQ with a delay, already deferred."""
    if not isinstance(error, NotOwnedError):
        return not_in_flight(what, message_id)
    if error.holder is None and delayed:
        return not_in_flight(what, message_id, "Message is deferred")
    holder = int(getattr(error.holder, "number", 0))
    internal_id = int.from_bytes(message_id[:8], "big")
    which = f" {internal_id}" if delayed else " "
    return not_in_flight(what, message_id, f"client does not own message{which}: {holder} vs {me}")


def parse_start(token: bytes) -> tuple[str, int]:
    """A SUB_ADVANCED start position ``<type>:<int64>`` (§2.3.1), with nsqd's error texts."""
    text = token.decode("latin-1")
    parts = text.split(":")  # ConsumeOffset.FromBytes: exactly one colon, a known type
    if len(parts) != 2 or parts[0] not in START_KINDS:
        raise ServerError("E_INVALID", f"invalid consume offset:{text}")
    kind, value = parts
    try:
        number = go_atoi(value, "ParseInt")
    except ValueError as exc:
        raise ServerError("E_INVALID", str(exc)) from None
    if kind == "special" and number != -1:
        raise ServerError("E_INVALID", "not supported offset type")
    return kind, number


def apply_start(hub: ChannelHub, start: tuple[str, int]) -> None:
    """Move a channel's cursor to a parsed start position (fatal ``E_INVALID commit log end
    of file`` when it seeks into a log that never had a record, as nsqd answers)."""
    kind, value = start
    store = hub.channel.partition
    if kind != "special" and not store.log:
        raise ServerError("E_INVALID", "commit log end of file")
    now = store.now()
    if kind == "special":
        hub.seek(now, end=True)
    elif kind == "virtual_queue":
        hub.seek(now, offset=value)
    elif kind == "msgcount":
        hub.seek(now, count=max(1, value))
    else:
        hub.seek(now, timestamp_ns=value * 1_000_000_000)


@dataclass(frozen=True, slots=True)
class Sub:
    """What a valid SUB / SUB_ORDERED / SUB_ADVANCED subscribes to."""

    part: DevPartition
    channel: str
    #: the SUB_ADVANCED start position (None: where the channel is)
    start: tuple[str, int] | None


def read_sub(
    command: ClientCommand,
    view: ClusterView,
    node: DevNode,
    *,
    initial: bool,
    heartbeats: bool,
    extend_support: bool,
    sample_rate: int,
) -> Sub:
    """Check a SUB command sent to ``node`` on a connection in the initial state (or not),
    with or without heartbeats, ``extend_support`` and ``sample_rate``, in nsqd's order."""
    name, params = command.name, command.params
    start: tuple[str, int] | None = None
    if name == b"SUB_ADVANCED" and len(params) >= 4 and params[3]:
        start = parse_start(params[3])
    if not initial:
        raise ServerError("E_INVALID", "cannot SUB in current state")
    if not heartbeats:
        raise ServerError("E_INVALID", "cannot SUB with heartbeats disabled")
    if len(params) < 2:
        raise ServerError("E_INVALID", "SUB insufficient number of parameters")
    topic_name = params[0].decode("latin-1")
    channel_name = params[1].decode("latin-1")
    if not is_valid_name(topic_name):
        raise ServerError("E_BAD_TOPIC", f'SUB topic name "{topic_name}" is not valid')
    if not is_valid_name(channel_name):
        raise ServerError("E_BAD_CHANNEL", f'SUB channel name "{channel_name}" is not valid')
    partition = partition_token(params, 4)
    part = view.hosted_partition(node, topic_name, partition, for_write=False)
    topic = part.topic
    if topic.ordered and name != b"SUB_ORDERED":
        raise ServerError("E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub")
    if topic.ext and not extend_support:
        raise ServerError(
            "E_SUB_EXTEND_NEED", "this topic is extended and should identify as extend support."
        )
    if not topic.ext and extend_support:
        raise ServerError(
            "E_SUB_EXTEND_FORBIDDON",
            "this topic is not extended and should not identify as extend support.",
        )
    view.check_leader(node, part, fatal=True)
    if (
        topic.disable_channel_auto_create
        and channel_name not in part.hubs
        and channel_name not in topic.registered_channels
    ):
        raise ServerError("E_SUB_CHANNEL_NOT_REGISTERED", "channel is not registered under topic.")
    if name == b"SUB_ORDERED" and sample_rate != 0:
        raise ServerError("E_INVALID", "order consume is not allowed while sample rate is not 0")
    return Sub(part, channel_name, start)
