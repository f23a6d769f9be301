"""Publishing: the asyncio :class:`Producer`, its config, results and retry policy."""

from nsq_ha.producer.config import ProducerConfig
from nsq_ha.producer.core import Producer
from nsq_ha.producer.policy import RetryPolicy
from nsq_ha.producer.result import PublishResult

__all__ = ["Producer", "ProducerConfig", "PublishResult", "RetryPolicy"]
