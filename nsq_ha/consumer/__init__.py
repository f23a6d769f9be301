"""Consuming: the partition-aware :class:`Consumer`, its :class:`Message`, RDY and backoff."""

from nsq_ha.consumer.backoff import BackoffStrategy, Exponential, Fixed
from nsq_ha.consumer.config import ConsumerConfig, ConsumerOptions
from nsq_ha.consumer.core import BatchHandler, Consumer, Handler
from nsq_ha.consumer.message import Message, Outcome
from nsq_ha.consumer.rdy import RdyPlanner

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
    "RdyPlanner",
]
