"""Consuming: the partition-aware :class:`Consumer`, its :class:`Message`, and backoff."""

from nsq_ha.consumer.backoff import BackoffStrategy, Exponential, Fixed
from nsq_ha.consumer.config import ConsumerConfig, ConsumerOptions
from nsq_ha.consumer.core import BatchHandler, Consumer, Handler
from nsq_ha.consumer.message import Message, Outcome

__all__ = [
    "BackoffStrategy",
    "BatchHandler",
    "Consumer",
    "ConsumerConfig",
    "ConsumerOptions",
    "Exponential",
    "Fixed",
    "Handler",
    "Message",
    "Outcome",
]
