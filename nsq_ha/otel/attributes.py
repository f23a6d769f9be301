"""Attribute names and values of nsq_ha's spans and metrics.

The ``messaging.*``, ``server.*`` and ``error.type`` names are OpenTelemetry's messaging
semantic conventions (written out here: the ``opentelemetry-semantic-conventions`` package keeps
the messaging names in its unstable "incubating" module). What those conventions have no name for
is under ``nsq.``: the fork's trace id, the queue offset, delivery attempts, the broker's error
code, the message outcome.

An NSQ *channel* is what the conventions call a consumer group (every channel gets each
message, the consumers of one channel share them): ``messaging.consumer.group.name``.
The fork's 64-bit trace id is a decimal *string* (``nsq.trace_id``): an attribute integer is
signed 64-bit, and a u64 does not always fit.

``messaging.client.id`` is the ``client_id`` the client sends in IDENTIFY, the one nsqd's
``/stats`` and nsqadmin show for its connections: ``ConnectionConfig(client_id=...)``, else the
host name (then every client of a host shares it: give each its own to tell them apart).
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from nsq_ha.errors import BrokerError, PublishError

if TYPE_CHECKING:
    from nsq_ha.connection import ConnectionConfig
    from nsq_ha.consumer import Message
    from nsq_ha.producer import PublishResult

__all__ = [
    "CLIENT_ID",
    "CONSUMER_GROUP",
    "DESTINATION",
    "ERROR_TYPE",
    "MESSAGE_ID",
    "NSQ_ATTEMPTS",
    "NSQ_ERROR_CODE",
    "NSQ_OFFSET",
    "NSQ_OUTCOME",
    "NSQ_ROLE",
    "NSQ_TRACE_ID",
    "OPERATION_NAME",
    "OPERATION_TYPE",
    "PARTITION",
    "SYSTEM",
    "client_id",
    "error_attributes",
    "message_attributes",
    "result_attributes",
    "server_attributes",
]

SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"
CONSUMER_GROUP = "messaging.consumer.group.name"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
MESSAGE_ID = "messaging.message.id"
BODY_SIZE = "messaging.message.body.size"
BATCH_COUNT = "messaging.batch.message_count"
CLIENT_ID = "messaging.client.id"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

NSQ_TRACE_ID = "nsq.trace_id"
NSQ_OFFSET = "nsq.message.offset"
NSQ_ATTEMPTS = "nsq.message.attempts"
NSQ_ERROR_CODE = "nsq.error.code"
NSQ_OUTCOME = "nsq.message.outcome"
NSQ_ROLE = "nsq.client.role"

#: ``messaging.system``: NSQ has no value of its own in the conventions' list
SYSTEM_NAME = "nsq"

Attributes = dict[str, str | int | bool]


def client_id(config: ConnectionConfig | None) -> str:
    """``messaging.client.id`` of a client whose connections use ``config`` (None: the
    defaults): the IDENTIFY ``client_id``, as ``ConnectionConfig.to_identify()`` sends it."""
    if config is not None and config.client_id is not None:
        return config.client_id
    return socket.gethostname()


def server_attributes(address: str) -> Attributes:
    """``server.address`` and ``server.port`` of an nsqd ``host:port`` (``[v6]:port``)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return {SERVER_ADDRESS: address}
    return {SERVER_ADDRESS: host.strip("[]"), SERVER_PORT: int(port)}


def result_attributes(result: PublishResult) -> Attributes:
    """What nsqd said about one published message: partition, offset, id, trace id, node."""
    attrs = server_attributes(result.address)
    if result.partition is not None:
        attrs[PARTITION] = str(result.partition)
    if result.offset is not None:
        attrs[NSQ_OFFSET] = result.offset
    message_id = result.message_id
    if message_id is not None:
        attrs[MESSAGE_ID] = message_id.hex()
    if result.trace_id is not None:
        attrs[NSQ_TRACE_ID] = str(result.trace_id)
    attrs[NSQ_ATTEMPTS] = result.attempts
    return attrs


def message_attributes(message: Message) -> Attributes:
    """What a delivered message says about itself."""
    attrs = server_attributes(message.address)
    attrs[MESSAGE_ID] = message.id.hex()
    attrs[BODY_SIZE] = len(message.body)
    attrs[NSQ_ATTEMPTS] = message.attempts
    if message.partition is not None:
        attrs[PARTITION] = str(message.partition)
    if message.offset is not None:
        attrs[NSQ_OFFSET] = message.offset
    if message.trace_id:  # 0: the publisher gave none
        attrs[NSQ_TRACE_ID] = str(message.trace_id)
    return attrs


def error_attributes(exc: BaseException) -> Attributes:
    """``error.type`` (the exception class) and, for broker errors, ``nsq.error.code`` (of the
    last error, when retries were exhausted)."""
    attrs: Attributes = {ERROR_TYPE: type(exc).__qualname__}
    cause = exc.last_error if isinstance(exc, PublishError) else exc
    if isinstance(cause, BrokerError) and cause.code:
        attrs[NSQ_ERROR_CODE] = cause.code
    return attrs
