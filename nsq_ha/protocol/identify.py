"""IDENTIFY (§3) and AUTH (§2.2) payloads: wire TypedDicts, a checked builder and parsers.

The wire dicts carry milliseconds, as nsqd does; :func:`build_identify` takes seconds and
:class:`Negotiated` reports seconds (converted by :mod:`nsq_ha.protocol.commands`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, cast, get_type_hints

from nsq_ha.errors import InvalidArgumentError, RemoteProtocolError
from nsq_ha.protocol.commands import json_object, ms_to_seconds, seconds_to_ms

#: nsqd's heartbeat interval when IDENTIFY does not set one (``--client-timeout`` / 2), seconds.
DEFAULT_HEARTBEAT_INTERVAL = 30.0
#: Largest duration IDENTIFY sends, in ms (2**31 - 1, about 24.8 days; nsqd's own limits are far
#: lower, and a bigger number would not even be read as an integer by Go).
MAX_DURATION_MS = 2**31 - 1
_DESIRED_TAG = re.compile(r"[a-zA-Z0-9_-]{1,100}")


class ExtFilterTerm(TypedDict):
    """One term of a type-4 ext filter."""

    filter_ext_key: str
    filter_data: str


class ExtFilter(TypedDict, total=False):
    """Server-side filter on a JSON-header value (§3.2; fork only, ext topics only)."""

    type: Literal[0, 1, 2, 3, 4]
    inverse: bool
    filter_ext_key: str
    filter_data: str
    filter_data_list: list[ExtFilterTerm]


class IdentifyRequest(TypedDict, total=False):
    """IDENTIFY JSON body as sent (durations in milliseconds, §3.1)."""

    client_id: str
    hostname: str
    feature_negotiation: bool
    heartbeat_interval: int
    user_agent: str
    output_buffer_size: int
    output_buffer_timeout: int
    msg_timeout: int
    sample_rate: int
    tls_v1: bool
    snappy: bool
    deflate: bool
    deflate_level: int
    desired_tag: str
    extend_support: bool
    ext_filter: ExtFilter


class IdentifyResponse(TypedDict, total=False):
    """IDENTIFY JSON answer with ``feature_negotiation`` (durations in milliseconds, §3.3)."""

    max_rdy_count: int
    version: str
    max_msg_timeout: int
    msg_timeout: int
    tls_v1: bool
    deflate: bool
    deflate_level: int
    max_deflate_level: int
    snappy: bool
    sample_rate: int
    auth_required: bool
    output_buffer_size: int
    output_buffer_timeout: int
    desired_tag: str


class AuthResponse(TypedDict):
    """AUTH JSON answer."""

    identity: str
    identity_url: str
    permission_count: int


def _duration_ms(
    value: float | None, what: str, minimum_ms: int, *, allow_off: bool = True
) -> int | None:
    """Convert seconds to ms, keep ``-1`` as nsqd's "off" value if allowed, check the bounds."""
    if value is None or (allow_off and value == -1):
        return None if value is None else -1
    milliseconds = seconds_to_ms(value, what)
    if milliseconds < minimum_ms:
        raise InvalidArgumentError(
            f"{what} {value!r} s is below nsqd's minimum of {minimum_ms / 1000} s "
            "(use None for the server default)"
        )
    if milliseconds > MAX_DURATION_MS:
        raise InvalidArgumentError(
            f"{what} {value!r} s is above the largest duration sent, {MAX_DURATION_MS / 1000} s"
        )
    return milliseconds


def _bounded_int(value: int | None, what: str, low: int, high: int) -> int | None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
    ):
        raise InvalidArgumentError(f"{what} must be an int in {low}..{high}, got {value!r}")
    return value


def _string(value: str | None, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a str, not {type(value).__name__}")
    return value


def _flag(value: bool | None) -> bool | None:
    return None if value is None else bool(value)


def build_identify(
    *,
    client_id: str | None = None,
    hostname: str | None = None,
    feature_negotiation: bool = True,
    heartbeat_interval: float | None = None,
    user_agent: str | None = None,
    output_buffer_size: int | None = None,
    output_buffer_timeout: float | None = None,
    msg_timeout: float | None = None,
    sample_rate: int | None = None,
    tls_v1: bool | None = None,
    snappy: bool | None = None,
    deflate: bool | None = None,
    deflate_level: int | None = None,
    desired_tag: str | None = None,
    extend_support: bool | None = None,
    ext_filter: ExtFilter | None = None,
) -> IdentifyRequest:
    """Build a checked IDENTIFY body; ``None`` leaves a key out (server default). Durations are
    seconds: ``heartbeat_interval`` (>= 1 s, or -1 to disable heartbeats, which forbids SUB),
    ``output_buffer_timeout`` (>= 1 ms, or -1 to flush every write), ``msg_timeout`` (>= 1 s).
    ``output_buffer_size`` is >= 64 bytes or -1 (unbuffered); upper bounds are server flags.
    ``deflate_level`` is 1..9 (nsqd takes 0 as level 0, §10); ``snappy`` excludes ``deflate``.
    """
    if output_buffer_size != -1:
        _bounded_int(output_buffer_size, "output_buffer_size", 64, 2**31 - 1)
    if snappy and deflate:
        raise InvalidArgumentError("snappy and deflate cannot both be requested")
    if desired_tag and _DESIRED_TAG.fullmatch(desired_tag) is None:
        raise InvalidArgumentError(
            f"desired_tag {desired_tag!r} must be 1..100 characters from [a-zA-Z0-9_-]"
        )
    if ext_filter is not None and not isinstance(ext_filter, Mapping):
        raise InvalidArgumentError("ext_filter must be a mapping")
    body: dict[str, object] = {  # in this order on the wire, as the recordings have it
        "client_id": _string(client_id, "client_id"),
        "hostname": _string(hostname, "hostname"),
        "feature_negotiation": bool(feature_negotiation),
        "heartbeat_interval": _duration_ms(heartbeat_interval, "heartbeat_interval", 1000),
        "user_agent": _string(user_agent, "user_agent"),
        "output_buffer_size": output_buffer_size,
        "output_buffer_timeout": _duration_ms(output_buffer_timeout, "output_buffer_timeout", 1),
        "msg_timeout": _duration_ms(msg_timeout, "msg_timeout", 1000, allow_off=False),
        "sample_rate": _bounded_int(sample_rate, "sample_rate", 0, 99),
        "tls_v1": _flag(tls_v1),
        "snappy": _flag(snappy),
        "deflate": _flag(deflate),
        "deflate_level": _bounded_int(deflate_level, "deflate_level", 1, 9),
        "desired_tag": desired_tag or None,
        "extend_support": _flag(extend_support),
        "ext_filter": ext_filter,
    }
    return cast(IdentifyRequest, {key: value for key, value in body.items() if value is not None})


@dataclass(frozen=True, slots=True, kw_only=True)
class Negotiated:
    """What one connection's IDENTIFY settled, in API units (seconds, bools), from
    :func:`parse_identify_response`; after a plain ``OK`` (no ``feature_negotiation``) only the
    request-side values are known."""

    feature_negotiation: bool
    version: str | None = None
    max_rdy_count: int | None = None
    msg_timeout: float | None = None
    max_msg_timeout: float | None = None
    output_buffer_size: int | None = None
    output_buffer_timeout: float | None = None
    sample_rate: int | None = None
    auth_required: bool = False
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int | None = None
    max_deflate_level: int | None = None
    desired_tag: str | None = None
    #: From the request (nsqd does not echo it): the connection said it decodes ext parts.
    extend_support: bool = False
    #: From the request: seconds between heartbeats, ``None`` when disabled.
    heartbeat_interval: float | None = DEFAULT_HEARTBEAT_INTERVAL
    #: The JSON answer as received (``None`` for a plain ``OK``).
    raw: IdentifyResponse | None = None

    @property
    def is_fork(self) -> bool | None:
        """True on the fork (its version has ``-HA.``: ``0.3.7-HA.1.13.0``; never compare
        versions instead), False on vanilla, None when the answer had no version."""
        return None if self.version is None else "-HA." in self.version


#: The JSON type of each key of the answer (a value of another type is refused).
_KEY_TYPES: dict[str, type] = get_type_hints(IdentifyResponse)
_MS_KEYS = ("max_msg_timeout", "msg_timeout", "output_buffer_timeout")
#: nsqd's numbers are Go int64s: a larger one is a lie (and would overflow a float in seconds)
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def parse_identify_response(data: bytes, request: Mapping[str, object] | None = None) -> Negotiated:
    """Parse the IDENTIFY answer of either server, ``OK`` or a JSON object (malformed JSON or
    a known key of the wrong type raises RemoteProtocolError; unknown keys are kept in ``raw``);
    ``request``, the body sent, fills in what nsqd does not echo."""
    request = request or {}
    interval = request.get("heartbeat_interval")
    heartbeat: float | None = DEFAULT_HEARTBEAT_INTERVAL
    if isinstance(interval, int) and not isinstance(interval, bool):
        if interval == -1:
            heartbeat = None
        elif interval > 0:
            heartbeat = ms_to_seconds(interval)
    extend = request.get("extend_support") is True
    side: dict[str, Any] = {"extend_support": extend, "heartbeat_interval": heartbeat}
    if data == b"OK":
        return Negotiated(feature_negotiation=False, **side)
    answer = json_object(data, "IDENTIFY response", RemoteProtocolError)
    fields: dict[str, Any] = {**side}
    for key, typ in _KEY_TYPES.items():
        value = answer.get(key)
        if value is not None and type(value) is not typ:  # json.loads makes no subclasses
            raise RemoteProtocolError(f"IDENTIFY response key {key!r} is not a JSON {typ.__name__}")
        if isinstance(value, int) and not _INT_MIN <= value <= _INT_MAX:
            raise RemoteProtocolError(f"IDENTIFY response key {key!r} is out of the int64 range")
        if key in _MS_KEYS and isinstance(value, int):
            value = ms_to_seconds(value)
        fields[key] = value is True if typ is bool else value
    return Negotiated(feature_negotiation=True, raw=cast(IdentifyResponse, answer), **fields)


def parse_auth_response(data: bytes) -> AuthResponse:
    """Parse the AUTH JSON answer; missing or mistyped keys raise RemoteProtocolError."""
    answer = json_object(data, "AUTH response", RemoteProtocolError)
    keys = (("identity", str), ("identity_url", str), ("permission_count", int))
    for key, kind in keys:
        value = answer.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise RemoteProtocolError(
                f"AUTH response key {key!r} is missing or not a {kind.__name__}"
            )
    return cast(AuthResponse, {key: answer[key] for key, _ in keys})
