"""Publishing: the asyncio :class:`Producer`, its config, results and retry policy."""

from nsq_ha.producer.config import ProducerConfig
from nsq_ha.producer.core import Producer, PublishResult
from nsq_ha.producer.policy import RetryPolicy

__all__ = ["Producer", "ProducerConfig", "PublishResult", "RetryPolicy"]
