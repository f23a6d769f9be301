"""Publishing: the asyncio :class:`Producer`, its results, retry policy and batching core."""

from nsq_ha.producer.config import ProducerConfig
from nsq_ha.producer.core import Producer, PublishResult
from nsq_ha.producer.message import OutgoingMessage, Receipt, prepare_message
from nsq_ha.producer.policy import RetryPolicy

__all__ = [
    "OutgoingMessage",
    "Producer",
    "ProducerConfig",
    "PublishResult",
    "Receipt",
    "RetryPolicy",
    "prepare_message",
]
