"""``nsq-ha tail``'s output of one message: the default line, ``--json`` and ``--format``."""

from __future__ import annotations

import argparse
import base64
import json
import string
from datetime import UTC, datetime
from typing import Any

from nsq_ha.consumer import Message
from nsq_ha.errors import NsqError

from .where import CliError

__all__ = ["FIELDS", "check_template", "format_message", "message_fields", "message_json"]

#: the fields a ``--format`` template may name
FIELDS = (
    "topic",
    "channel",
    "partition",
    "offset",
    "id",
    "trace_id",
    "attempts",
    "timestamp",
    "time",
    "tag",
    "ext",
    "body",
    "body_base64",
)


def check_template(template: str | None) -> None:
    """A ``--format`` template names only :data:`FIELDS` (no attribute or index access) and
    formats a sample message; else a CliError (exit 2)."""
    if template is None:
        return
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise CliError(f"--format {template!r}: {exc}", 2) from None
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if name not in FIELDS:
            raise CliError(
                f"--format: unknown field {{{name}}} (fields: {', '.join(FIELDS)})"
                if name and not name.isdigit()
                else "--format: name each field, e.g. {body} ({} and {0} are not fields)",
                2,
            )
    sample = dict.fromkeys(FIELDS, "")
    try:
        template.format_map(sample)
    except (ValueError, TypeError) as exc:
        raise CliError(f"--format {template!r}: {exc}", 2) from None


def message_json(message: Message) -> dict[str, Any]:
    """One delivered message as the JSON object ``nsq-ha tail --json`` prints."""
    try:
        body: str = message.body.decode("utf-8")
        is_b64 = False
    except UnicodeDecodeError:
        body, is_b64 = base64.b64encode(message.body).decode("ascii"), True
    return {
        "partition": message.partition,
        "offset": message.offset,
        "id": message.id.hex(),
        "trace_id": message.trace_id,
        "attempts": message.attempts,
        "timestamp": message.timestamp,
        "ext": _ext_of(message),
        "body": body,
        "body_base64": is_b64,
    }


def _ext_of(message: Message) -> Any:
    try:
        return dict(message.ext) if message.ext_version is not None else None
    except NsqError:
        return None


def message_fields(message: Message, topic: str, channel: str) -> dict[str, object]:
    """The values a ``--format`` template can name (``-`` for what the message lacks)."""
    ext = _ext_of(message)
    tag = ext.get("##client_dispatch_tag") if isinstance(ext, dict) else None
    fields: dict[str, object] = {
        "topic": topic,
        "channel": channel,
        "partition": message.partition,
        "offset": message.offset,
        "id": message.id.hex(),
        "trace_id": message.trace_id,
        "attempts": message.attempts,
        "timestamp": message.timestamp,
        "time": datetime.fromtimestamp(message.timestamp / 1e9, UTC).isoformat(),
        "tag": tag,
        "ext": None if ext is None else json.dumps(ext, sort_keys=True),
        "body": message.body.decode("utf-8", "backslashreplace"),
        "body_base64": base64.b64encode(message.body).decode("ascii"),
    }
    return {name: "-" if value is None else value for name, value in fields.items()}


def format_message(message: Message, args: argparse.Namespace, topic: str, channel: str) -> str:
    """The line ``nsq-ha tail`` prints for ``message`` (``--json``, ``--format`` or the
    default ``[partition@offset] body``)."""
    if args.json:
        return json.dumps(message_json(message))
    if args.template is not None:
        try:
            return str(args.template.format_map(message_fields(message, topic, channel)))
        except (ValueError, TypeError) as exc:
            raise CliError(f"--format {args.template!r}: {exc}", 2) from None
    where_from = "-" if message.partition is None else str(message.partition)
    offset = "" if message.offset is None else f"@{message.offset}"
    return f"[{where_from}{offset}] {message.body.decode('utf-8', 'backslashreplace')}"
