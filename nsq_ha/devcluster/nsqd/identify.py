"""The emulated nsqd's IDENTIFY: validation in the fork's order and its JSON answer (§3).

:func:`read_identify` turns an IDENTIFY body into an :class:`Identity` or raises the
:class:`~nsq_ha.devcluster.model.ServerError` nsqd answers; :func:`identify_answer` is the
negotiated answer with the fork's key order and defaults.  The connection applies the identity
and performs the TLS / snappy / deflate upgrades itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..ext_filter import unsupported_key
from ..model import FORK_VERSION, Limits, ServerError

__all__ = ["MAX_DEFLATE_LEVEL", "Identity", "identify_answer", "read_identify"]

MAX_HEARTBEAT_MS = 60_000
MAX_OUTPUT_BUFFER_SIZE = 65536
MAX_OUTPUT_BUFFER_TIMEOUT_MS = 1000
MAX_DEFLATE_LEVEL = 6
MAX_TAG_LENGTH = 100
_INTS = (
    "heartbeat_interval",
    "output_buffer_size",
    "output_buffer_timeout",
    "sample_rate",
    "msg_timeout",
    "deflate_level",
)
_STRINGS = ("client_id", "short_id", "hostname", "long_id", "user_agent", "desired_tag")
_BOOLS = ("feature_negotiation", "tls_v1", "snappy", "deflate", "extend_support")


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    """What one IDENTIFY asks for, validated."""

    #: seconds (None: heartbeats off)
    heartbeat_interval: float | None
    output_buffer_size: int
    #: the client chose an output buffer size (SUB otherwise raises it to 4096)
    output_buffer_size_set: bool
    output_buffer_timeout_ms: int
    sample_rate: int
    #: seconds (None: keep the server's default)
    msg_timeout: float | None
    desired_tag: str
    extend_support: bool
    ext_filter: dict[str, Any] | None
    client_id: str
    hostname: str
    user_agent: str
    feature_negotiation: bool
    tls: bool
    snappy: bool
    deflate: bool
    deflate_level: int


def read_identify(body: bytes, limits: Limits) -> Identity:
    """Decode and validate an IDENTIFY body as nsqd does (§3.1, errors in its order)."""
    data = decode_identify(body)

    def invalid(text: str) -> ServerError:
        return ServerError("E_BAD_BODY", f"IDENTIFY {text}")

    heartbeat = data.get("heartbeat_interval", 0)
    if heartbeat == -1:
        interval: float | None = None
    elif heartbeat == 0:
        interval = limits.client_timeout / 2
    elif 1000 <= heartbeat <= MAX_HEARTBEAT_MS:
        interval = heartbeat / 1000
    else:
        raise invalid(f"heartbeat interval ({heartbeat}) is invalid")
    size = data.get("output_buffer_size", 0)
    if size == -1:
        size = 1
    elif size == 0:
        size = 100
    elif size < 64:
        raise invalid(f"output buffer size ({size}) is invalid")
    size = min(size, MAX_OUTPUT_BUFFER_SIZE)
    timeout = data.get("output_buffer_timeout", 0)
    if 0 < timeout < 10:
        timeout = 10
    if timeout == -1:
        timeout = 0
    elif timeout == 0:
        timeout = 50
    elif not 1 <= timeout <= MAX_OUTPUT_BUFFER_TIMEOUT_MS:
        raise invalid(f"output buffer timeout ({timeout}) is invalid")
    sample_rate = data.get("sample_rate", 0)
    if not 0 <= sample_rate <= 99:
        raise invalid(f"sample rate ({sample_rate}) is invalid")
    msg_timeout = data.get("msg_timeout", 0)
    if msg_timeout != 0 and not 1000 <= msg_timeout <= limits.max_msg_timeout * 1000:
        raise invalid(f"msg timeout ({msg_timeout}) is invalid")
    tag = data.get("desired_tag", "")
    if len(tag) > MAX_TAG_LENGTH:
        raise invalid(f"invalid tag len {len(tag)}, exceed limit {MAX_TAG_LENGTH}")
    ext_filter = data.get("ext_filter") or None
    key = unsupported_key(ext_filter) if ext_filter else None
    if key is not None:
        raise invalid(f"ext_filter key {key!r} uses gjson path syntax the devcluster lacks")
    negotiation = bool(data.get("feature_negotiation"))
    snappy = negotiation and bool(data.get("snappy"))
    deflate = negotiation and bool(data.get("deflate"))
    if snappy and deflate:
        raise ServerError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
    return Identity(
        heartbeat_interval=interval,
        output_buffer_size=size,
        output_buffer_size_set=data.get("output_buffer_size", 0) != 0,
        output_buffer_timeout_ms=timeout,
        sample_rate=sample_rate,
        msg_timeout=msg_timeout / 1000 if msg_timeout else None,
        desired_tag=tag,
        extend_support=bool(data.get("extend_support", False)),
        ext_filter=ext_filter,
        client_id=data.get("client_id") or data.get("short_id") or "",
        hostname=data.get("hostname") or data.get("long_id") or "",
        user_agent=data.get("user_agent", ""),
        feature_negotiation=negotiation,
        tls=negotiation and bool(data.get("tls_v1")) and limits.tls_context is not None,
        snappy=snappy,
        deflate=deflate,
        deflate_level=min(int(data.get("deflate_level") or 0), MAX_DEFLATE_LEVEL) if deflate else 0,
    )


def identify_answer(identity: Identity, limits: Limits, msg_timeout: float) -> bytes:
    """The negotiated IDENTIFY answer (the fork's keys, in its order)."""
    answer: dict[str, Any] = {
        "max_rdy_count": limits.max_rdy_count,
        "version": FORK_VERSION,
        "max_msg_timeout": int(limits.max_msg_timeout * 1000),
        "msg_timeout": int(msg_timeout * 1000),
        "tls_v1": identity.tls,
        "deflate": identity.deflate,
        "deflate_level": identity.deflate_level,
        "max_deflate_level": MAX_DEFLATE_LEVEL,
        "snappy": identity.snappy,
        "sample_rate": identity.sample_rate,
        "auth_required": False,
        "output_buffer_size": identity.output_buffer_size,
        "output_buffer_timeout": identity.output_buffer_timeout_ms,
    }
    if identity.desired_tag:
        answer["desired_tag"] = identity.desired_tag
    return json.dumps(answer, separators=(",", ":")).encode()


def decode_identify(body: bytes) -> dict[str, Any]:
    """The IDENTIFY JSON as Go's ``json.Unmarshal`` into nsqd's struct reads it: ``null``
    sets nothing, keys match case-insensitively (the last one wins), every field is typed
    (Go ``int``: 64 bits, ``sample_rate`` 32) and unknown keys are ignored."""
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raw = []
    data = _fields(raw, _FIELDS) if raw is not None else {}
    if data is None:
        raise ServerError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    return data


def _fields(raw: object, types: dict[str, Any]) -> dict[str, Any] | None:
    """The known fields of a JSON object (lower-cased names), or None on a type error."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.lower()
        kind = types.get(name)
        if kind is None or value is None:
            continue
        if isinstance(kind, dict):  # a nested struct (ext_filter)
            value = _fields(value, kind)
        elif kind == "list":  # filter_data_list: a list of MultiFilterData
            if not isinstance(value, list):
                return None
            value = [_fields(item, _MULTI_FILTER) if item is not None else {} for item in value]
            if any(item is None for item in value):
                return None
        elif not _typed(value, kind):
            return None
        if value is None:
            return None
        out[name] = value
    return out


def _typed(value: object, kind: Any) -> bool:
    if kind is bool or kind is str:
        return isinstance(value, kind)
    bits = int(kind)
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and -(1 << (bits - 1)) <= value < 1 << (bits - 1)
    )


_MULTI_FILTER: dict[str, Any] = {"filter_ext_key": str, "filter_data": str}
_EXT_FILTER: dict[str, Any] = {
    "type": 64,
    "inverse": bool,
    "filter_ext_key": str,
    "filter_data": str,
    "filter_data_list": "list",
}
_FIELDS: dict[str, Any] = {
    **dict.fromkeys(_INTS, 64),
    "sample_rate": 32,
    **dict.fromkeys(_STRINGS, str),
    **dict.fromkeys(_BOOLS, bool),
    "ext_filter": _EXT_FILTER,
}
