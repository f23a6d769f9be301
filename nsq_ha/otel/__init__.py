"""OpenTelemetry tracing and metrics for nsq_ha (the ``otel`` extra: ``pip install nsq-ha[otel]``).

With no code change: ``opentelemetry-instrument python app.py`` finds
:class:`NsqHaInstrumentor` through the ``opentelemetry_instrumentor`` entry point ``nsq_ha``
(as it finds the aiokafka and confluent-kafka instrumentors). In code::

    from nsq_ha import otel

    otel.instrument()          # the global tracer and meter providers, or pass your own
    ...                        # every Producer and Consumer of the process is traced
    otel.uninstrument()

(:func:`instrument` is ``NsqHaInstrumentor().instrument(...)``; a second call, or one after
``opentelemetry-instrument`` did it, logs a warning and changes nothing.)

Spans (OpenTelemetry's messaging semantic conventions, ``messaging.system="nsq"``):

* ``publish {topic}``, kind PRODUCER, per ``publish``/``publish_many`` call: topic, partition,
  nsqd, and for one message its id (``messaging.message.id``, the 16 bytes consumers see, in
  hex), queue offset (``nsq.message.offset``) and the fork's trace id (``nsq.trace_id``);
  ``error.type`` and ``nsq.error.code`` when it fails.
* ``process {topic}``, kind CONSUMER, per handler call of :meth:`Consumer.run` (one message)
  and :meth:`Consumer.run_batches` (a batch: one span, linked to each message's publish): channel
  (``messaging.consumer.group.name``), partition, id, attempts, offset, trace id.
* ``async for``, ``get()``, ``get_many()`` and the blocking facade's ``get()``, with no code of
  yours (:mod:`nsq_ha.otel.pulling`): ``receive {topic}`` (kind CLIENT) per call that returned
  messages, linked to their publish spans; ``process {topic}`` per message from the hand-out
  to its ``finish()``/``requeue()`` (a ``finish {topic}``/``requeue {topic}`` settle span
  inside it), to the task's next ``get()``/iteration, or to the consumer's close, whichever
  comes first, current in the loop body; :func:`processing` delimits it yourself.

Every span has ``messaging.client.id``: the client's IDENTIFY ``client_id`` (nsqd's ``/stats``
shows it; ``ConnectionConfig(client_id=...)``, else the host name).

How the consumer's span finds the publish's (:mod:`nsq_ha.otel.propagation`): on ext topics the
W3C ``traceparent``/``tracestate`` travel in the ext JSON header and the consumer's span is the
publish span's child; on other fork topics only the fork's 64-bit trace id travels, and both spans
carry it as the ``nsq.trace_id`` attribute (64 bits cannot rebuild a span context to link to).

Metrics are listed in :mod:`nsq_ha.otel.metrics`; events (leader changes, reconnects, give-ups)
come from :mod:`nsq_ha.events`, which needs no OpenTelemetry at all.

A Prometheus endpoint (``pip install opentelemetry-exporter-prometheus``, which brings
``prometheus-client``; neither is a dependency of nsq_ha)::

    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import start_http_server

    from nsq_ha import otel

    start_http_server(9464)  # http://localhost:9464/metrics
    otel.instrument(meter_provider=MeterProvider(metric_readers=[PrometheusMetricReader()]))

Prometheus then shows, for example, ``messaging_client_operation_duration_seconds`` (a
histogram), ``messaging_client_sent_messages_total``, ``messaging_client_consumed_messages_total``,
``nsq_consumer_messages_total{nsq_message_outcome="finished"}``, ``nsq_consumer_in_flight``,
``nsq_consumer_rdy``, ``nsq_consumer_lag{messaging_destination_partition_id="0"}`` (messages
the channel has not confirmed, read from nsqd's ``/stats`` every ``lag_interval`` seconds),
``nsq_producer_retries_total`` and ``nsq_client_leader_changes_total``.

Nothing in the client imports this package: without :func:`instrument` the clients run the
code they ran before, and :mod:`nsq_ha.events` costs one check on rare paths.
"""

from __future__ import annotations

try:  # only to say what is missing
    import opentelemetry.instrumentation.instrumentor
    import opentelemetry.trace  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "nsq_ha.otel needs OpenTelemetry: pip install 'nsq-ha[otel]' "
        "(opentelemetry-api, opentelemetry-instrumentation, and opentelemetry-sdk to export)"
    ) from exc

from nsq_ha.otel.instrumentor import (
    NsqHaInstrumentor,
    instrument,
    is_instrumented,
    uninstrument,
)
from nsq_ha.otel.propagation import extract
from nsq_ha.otel.pulling import processing

__all__ = [
    "NsqHaInstrumentor",
    "extract",
    "instrument",
    "is_instrumented",
    "processing",
    "uninstrument",
]
