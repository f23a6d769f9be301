"""Settings of one nsqd connection: a frozen, validated dataclass.

Durations are float seconds; the IDENTIFY body (milliseconds on the wire) is produced by
:func:`nsq_ha.protocol.identify.build_identify`, which also checks the values nsqd would refuse.
"""

from __future__ import annotations

import dataclasses
import difflib
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass

from nsq_ha._version import __version__
from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError
from nsq_ha.protocol.identify import MAX_DURATION_MS, ExtFilter, IdentifyRequest, build_identify

#: nsqd's default ``--max-msg-size``.
DEFAULT_MAX_MSG_SIZE = 1024 * 1024
#: nsqd's default ``--max-body-size``.
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024
#: The deflate level asked for when none is given: go-nsq's default, and the most nsqd allows
#: unless started with a higher ``--max-deflate-level``.
DEFAULT_DEFLATE_LEVEL = 6
#: Longest duration option accepted, in seconds (2**31 - 1 ms, about 24.8 days): anything
#: longer is no deadline at all, and nsqd could not read it as milliseconds.
MAX_DURATION = MAX_DURATION_MS / 1000
_REDACTED = "<redacted>"


def parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    """Return ``(host, port)`` from ``"host:port"`` or ``(host, port)``; ConfigError if bad."""
    if isinstance(address, tuple):
        host, port = address
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ConfigError(f"address {address!r} is not host:port")
        port = int(port_text)
    if not host or not 0 < port < 65536:
        raise ConfigError(f"address {address!r} is not host:port")
    return host.strip("[]"), port


def _check_secret(secret: object) -> None:
    """Refuse an AUTH secret that cannot be sent; the error never shows the secret."""
    if secret is None:
        return
    if not isinstance(secret, str | bytes):
        raise ConfigError(f"auth_secret must be str or bytes, not {type(secret).__name__}")
    if not secret:
        raise ConfigError("auth_secret must not be empty (use None for no AUTH)")
    try:
        if isinstance(secret, str):
            secret.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError("auth_secret is not encodable as UTF-8 (its value not shown)") from None


def _size(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class ConnectionConfig:
    """How to open, negotiate and run one connection to one nsqd.

    IDENTIFY settings (``None`` = nsqd's default): ``client_id``, ``hostname``, ``user_agent``,
    ``heartbeat_interval`` (s, >= 1; ``-1`` disables heartbeats, which forbids SUB),
    ``output_buffer_size`` (bytes), ``output_buffer_timeout`` (s), ``msg_timeout`` (s),
    ``sample_rate``, ``desired_tag``, ``extend_support`` (True exactly when subscribing to a
    fork ext topic), ``ext_filter``. Upgrades: ``tls`` (an ``ssl.SSLContext``: nsqd must agree),
    ``tls_server_hostname`` (default: the host), ``snappy`` or ``deflate`` (``deflate_level``).

    AUTH: ``auth_secret`` is sent when nsqd says ``auth_required``, by default only over TLS
    (else the handshake fails with HandshakeError): any host that lookupd names, or anyone on
    the path, could claim ``auth_required`` and read it. ``allow_plaintext_auth=True`` sends it
    in clear text anyway (a trusted network only). It never appears in ``repr``, logs or errors.

    Limits checked before sending: ``max_msg_size``, ``max_body_size`` (nsqd's flags, its
    defaults). Timeouts, finite seconds above 0 and at most :data:`MAX_DURATION`:
    ``connect_timeout`` (TCP + handshake), ``command_timeout`` (an answer, or a full socket
    buffer's drain), ``close_timeout`` (CLS and in-flight work at close).
    ``write_buffer_limit`` is the socket-buffer high-water mark above which senders wait.
    """

    client_id: str | None = None
    hostname: str | None = None
    user_agent: str | None = f"nsq_ha/{__version__}"
    heartbeat_interval: float | None = None
    output_buffer_size: int | None = None
    output_buffer_timeout: float | None = None
    msg_timeout: float | None = None
    sample_rate: int | None = None
    desired_tag: str | None = None
    extend_support: bool = False
    ext_filter: ExtFilter | None = None
    tls: ssl.SSLContext | None = None
    tls_server_hostname: str | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = DEFAULT_DEFLATE_LEVEL
    auth_secret: str | bytes | None = None
    allow_plaintext_auth: bool = False
    max_msg_size: int = DEFAULT_MAX_MSG_SIZE
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    connect_timeout: float = 10.0
    command_timeout: float = 30.0
    close_timeout: float = 5.0
    write_buffer_limit: int = 256 * 1024

    def __post_init__(self) -> None:
        """Check every value; a bad one raises ConfigError naming it."""
        if self.tls is not None and not isinstance(self.tls, ssl.SSLContext):
            raise ConfigError(f"tls must be an ssl.SSLContext, not {type(self.tls).__name__}")
        _check_secret(self.auth_secret)
        if not isinstance(self.allow_plaintext_auth, bool):
            raise ConfigError("allow_plaintext_auth must be a bool")
        _size(self.max_msg_size, "max_msg_size", 1)
        _size(self.max_body_size, "max_body_size", 1)
        _size(self.write_buffer_limit, "write_buffer_limit", 1024)
        for name in ("connect_timeout", "command_timeout", "close_timeout"):
            seconds(getattr(self, name), name, maximum=MAX_DURATION)
        self.to_identify()  # build_identify raises InvalidArgumentError (a ConfigError)

    def __repr__(self) -> str:
        """Every field, with the AUTH secret redacted."""
        shown = {item.name: repr(getattr(self, item.name)) for item in dataclasses.fields(self)}
        if self.auth_secret is not None:
            shown["auth_secret"] = _REDACTED
        return f"ConnectionConfig({', '.join(f'{name}={value}' for name, value in shown.items())})"

    def to_identify(self) -> IdentifyRequest:
        """Return the IDENTIFY body (always with ``feature_negotiation``)."""
        return build_identify(
            client_id=self.client_id if self.client_id is not None else socket.gethostname(),
            hostname=self.hostname if self.hostname is not None else socket.gethostname(),
            feature_negotiation=True,
            heartbeat_interval=self.heartbeat_interval,
            user_agent=self.user_agent,
            output_buffer_size=self.output_buffer_size,
            output_buffer_timeout=self.output_buffer_timeout,
            msg_timeout=self.msg_timeout,
            sample_rate=self.sample_rate,
            tls_v1=True if self.tls is not None else None,
            snappy=True if self.snappy else None,
            deflate=True if self.deflate else None,
            deflate_level=self.deflate_level if self.deflate else None,
            desired_tag=self.desired_tag,
            extend_support=True if self.extend_support else None,
            ext_filter=self.ext_filter,
        )


def check_options(owner: str, given: Iterable[str], known: tuple[str, ...]) -> None:
    """Refuse an option of a Consumer or Producer not in ``known``, naming the nearest."""
    for name in given:
        if name not in known:
            hint = f" (the options: {', '.join(known)})"
            for near in difflib.get_close_matches(name, known, n=1):
                hint = f"; did you mean {near!r}?"
            raise ConfigError(f"a {owner} has no option {name!r}{hint}")
