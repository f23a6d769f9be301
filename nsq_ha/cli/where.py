"""Where the cluster is and how to connect to it: the options every client command shares.

``--lookupd URL`` / ``--nsqd HOST:PORT`` (repeatable; defaults from the comma-separated
environment variables ``NSQ_HA_LOOKUPD`` / ``NSQ_HA_NSQD``, and any of the two flags on the
command line replaces both defaults), ``--tls`` (``--tls-ca``, ``--tls-cert``, ``--tls-key``),
``--auth-secret-file`` (the secret is read from a file, never given on the command line, and
never shown) and ``--snappy`` / ``--deflate``. :func:`where_of` turns them into the addresses
and the :class:`~nsq_ha.connection.ConnectionConfig` a Producer or Consumer takes.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsq_ha.connection import ConnectionConfig
from nsq_ha.errors import ConfigError, TopicNotFoundError
from nsq_ha.lookup import LookupClient
from nsq_ha.lookup.wire import PartitionMap

__all__ = [
    "ENV_LOOKUPD",
    "ENV_NSQD",
    "CliError",
    "Where",
    "add_where_options",
    "connection_config",
    "existing_map",
    "read_secret",
    "topic_of",
    "where_of",
]

#: environment variable: default ``--lookupd`` addresses, comma-separated
ENV_LOOKUPD = "NSQ_HA_LOOKUPD"
#: environment variable: default ``--nsqd`` addresses, comma-separated
ENV_NSQD = "NSQ_HA_NSQD"


class CliError(Exception):
    """A failure to report in one line, with its exit code (2: bad input, 1: it did not work)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _env_list(name: str, environ: Mapping[str, str] | None = None) -> list[str]:
    text = (os.environ if environ is None else environ).get(name, "")
    return [part.strip() for part in text.split(",") if part.strip()]


class _EnvDefault(list[str]):
    """The default of ``--lookupd`` / ``--nsqd`` taken from the environment (a marker type:
    a flag on the command line replaces it, and the other flag's, instead of appending)."""


class _AppendOverEnv(argparse.Action):
    """``append``, except that the first use on the command line drops the environment's
    defaults of both address options (the command line wins)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        for name in ("lookupd", "nsqd"):
            if isinstance(getattr(namespace, name, None), _EnvDefault):
                setattr(namespace, name, [])
        current = list(getattr(namespace, self.dest) or [])
        current.append(values)
        setattr(namespace, self.dest, current)


def add_where_options(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
) -> argparse._ArgumentGroup:
    """Add the address, TLS, AUTH and compression options to ``parser`` (the ``where``
    parent of every client command); returns the group, for more options. The address
    defaults come from ``environ`` (default: ``os.environ``) now."""
    group = parser.add_argument_group("where the cluster is, and how to connect")
    group.add_argument(
        "--lookupd",
        action=_AppendOverEnv,
        default=_EnvDefault(_env_list(ENV_LOOKUPD, environ)),
        metavar="URL",
        help=f"nsqlookupd HTTP address, e.g. http://127.0.0.1:4161 (repeatable; default: "
        f"${ENV_LOOKUPD}, comma-separated)",
    )
    group.add_argument(
        "--nsqd",
        action=_AppendOverEnv,
        default=_EnvDefault(_env_list(ENV_NSQD, environ)),
        metavar="HOST:PORT",
        help=f"vanilla nsqd TCP address, instead of --lookupd (repeatable; default: "
        f"${ENV_NSQD}, comma-separated)",
    )
    group.add_argument("--tls", action="store_true", help="connect to nsqd with TLS")
    group.add_argument(
        "--tls-ca",
        type=Path,
        metavar="FILE",
        help="CA certificates (PEM) to verify nsqd; implies --tls (default: the system's)",
    )
    group.add_argument(
        "--tls-cert", type=Path, metavar="FILE", help="client certificate (PEM); implies --tls"
    )
    group.add_argument(
        "--tls-key", type=Path, metavar="FILE", help="the client certificate's key (PEM)"
    )
    group.add_argument(
        "--auth-secret-file",
        type=Path,
        metavar="FILE",
        help="AUTH with the secret in FILE (trailing newline dropped; sent only over TLS)",
    )
    compression = parser.add_mutually_exclusive_group()
    compression.add_argument("--snappy", action="store_true", help="snappy compression")
    compression.add_argument("--deflate", action="store_true", help="deflate compression")
    return group


@dataclass(frozen=True, slots=True)
class Where:
    """The addresses and connection settings of a command (secrets stay inside ``config``,
    whose repr redacts them)."""

    lookupd: list[str] = field(default_factory=list)
    nsqd: list[str] = field(default_factory=list)
    config: ConnectionConfig | None = None
    from_env: bool = False

    def client_kwargs(self) -> dict[str, Any]:
        """``lookupd=`` or ``nsqd=`` (and ``connection=`` when set) for a Producer/Consumer."""
        kwargs: dict[str, Any] = (
            {"lookupd": list(self.lookupd)} if self.lookupd else {"nsqd": list(self.nsqd)}
        )
        if self.config is not None:
            kwargs["connection"] = self.config
        return kwargs


def read_secret(path: Path) -> bytes:
    """The AUTH secret in ``path`` (one trailing newline dropped); a CliError (exit 2) that
    names the file, never its content, when it cannot be read or is empty."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CliError(f"cannot read --auth-secret-file {str(path)!r}: {reason}", 2) from None
    secret = raw[:-1] if raw.endswith(b"\n") else raw
    secret = secret[:-1] if secret.endswith(b"\r") else secret
    if not secret:
        raise CliError(f"--auth-secret-file {str(path)!r} is empty", 2)
    return secret


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    ca, cert, key = args.tls_ca, args.tls_cert, args.tls_key
    if key is not None and cert is None:
        raise CliError("--tls-key needs --tls-cert", 2)
    if not (args.tls or ca is not None or cert is not None):
        return None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if ca is not None:
            context.load_verify_locations(cafile=str(ca))
        if cert is not None:
            context.load_cert_chain(str(cert), None if key is None else str(key))
    except (OSError, ssl.SSLError) as exc:
        what = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise CliError(f"TLS files: {what}", 2) from None
    return context


def connection_config(args: argparse.Namespace) -> ConnectionConfig | None:
    """The ConnectionConfig of ``--tls*``, ``--auth-secret-file``, ``--snappy|--deflate``;
    ``None`` when none is given (the client's defaults)."""
    tls = _tls(args)
    secret = None if args.auth_secret_file is None else read_secret(args.auth_secret_file)
    if tls is None and secret is None and not args.snappy and not args.deflate:
        return None
    try:
        return ConnectionConfig(
            tls=tls, auth_secret=secret, snappy=bool(args.snappy), deflate=bool(args.deflate)
        )
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None


def where_of(args: argparse.Namespace, *, required: bool = True) -> Where:
    """The addresses (``--lookupd`` or ``--nsqd``, else the environment's) and the connection
    config of ``args``; a CliError (exit 2) when both or (``required``) neither are given."""
    lookupd, nsqd = list(args.lookupd or ()), list(args.nsqd or ())
    from_env = isinstance(args.lookupd, _EnvDefault) and isinstance(args.nsqd, _EnvDefault)
    if lookupd and nsqd:
        hint = f" (${ENV_LOOKUPD} and ${ENV_NSQD} are both set)" if from_env else ""
        raise CliError(f"give --lookupd or --nsqd, not both{hint}", 2)
    if required and not lookupd and not nsqd:
        raise CliError(
            "give --lookupd URL (fork or vanilla nsqlookupd) or --nsqd HOST:PORT "
            f"(or set ${ENV_LOOKUPD} / ${ENV_NSQD})",
            2,
        )
    return Where(lookupd=lookupd, nsqd=nsqd, config=connection_config(args), from_env=from_env)


def json_object(text: str | None, option: str) -> dict[str, Any] | None:
    """An option's JSON object (``None`` when not given), or CliError (exit 2) naming it."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{option} is not valid JSON: {exc.msg} at column {exc.colno}", 2) from None
    if not isinstance(value, dict):
        raise CliError(f"{option} must be a JSON object, got {type(value).__name__}", 2)
    return value


def topic_of(args: argparse.Namespace) -> str:
    """``--topic``, checked (a CliError, exit 2, when it is not a valid name)."""
    from nsq_ha.protocol.names import validate_topic

    try:
        return validate_topic(args.topic)
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None


async def existing_map(lookup: LookupClient, topic: str, access: str) -> PartitionMap:
    """The topic's map, or TopicNotFoundError when lookupd does not know it."""
    pmap = await lookup.lookup(topic, "w" if access == "w" else "r", force=True)
    if pmap.fork and not pmap.partitions and (pmap.meta is None or pmap.partition_num == 0):
        raise TopicNotFoundError(
            f"topic {topic!r} does not exist (create it: nsq-ha topic create --topic {topic} "
            "--partitions N --replicas R)"
        )
    if not pmap.fork and not pmap.producers:
        raise TopicNotFoundError(f"topic {topic!r} has no nsqd producing it")
    return pmap
