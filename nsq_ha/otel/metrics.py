"""nsq_ha's metrics, through the OpenTelemetry metrics API: :class:`Metrics`.

Three sources, none of them on the client's hot path when nothing is instrumented:

* the instrumented calls themselves (publish latency, messages sent, publish errors by code,
  handler duration, the offset a handler last got per partition);
* :mod:`nsq_ha.events` (reconnects, leader changes, give-ups), through one listener;
* the clients' own counters (``Producer.stats``, ``Consumer.stats``), read only when the
  metric reader collects (observable instruments): received, finished, requeued, timed out,
  given up and abandoned messages per partition, in flight, RDY, publish retries.

A consumer's counters stay in its channel's totals after it closes (they are added to a
closed-consumers tally) while another instrumented consumer of the same topic and channel runs.
When the last one closes (or, dropped without ``close()``, is found gone by a collection), the
channel is *retired*: the next collection still reports its final counts and offsets, once
(``messaging.client.consumed.messages``, ``nsq.consumer.messages``, ``nsq.consumer.offset``;
each of these instruments in the first of its callback calls after the retirement, whatever
order the reader calls them in), and then nsq_ha forgets the channel: its tallies and offsets
are dropped and no later collection reports its series, so a consumer that closes between two
scrapes is counted in full and short-lived consumers on channels of their own leave nothing
behind in nsq_ha. A consumer that starts on a retired channel before it is forgotten
un-retires it (its totals continue). With several readers, the reader that collects first
after the retirement is the one that gets the final counts. When nothing collects (metrics
instrumented and never read), at most :data:`MAX_RETIRED` retired channels are kept, the
oldest forgotten first. The lag gauges (below) end at the close: nsqd's lag of a channel
nobody consumes is not the consumer's.

The OpenTelemetry SDK keeps its own state: with cumulative temporality (the default, and
Prometheus') it keeps, and exports for ever, every series a *synchronous* instrument recorded,
here ``messaging.process.duration`` per channel (bounded by the SDK's cardinality limit, 2000
series per instrument by default). A reader with delta temporality exports a series only when
it changed, and the SDK then forgets it; a :class:`~opentelemetry.sdk.metrics.view.View` can
also drop ``messaging.consumer.group.name`` from that histogram. A producer's retries stay in
the totals after it closes (one series). A client dropped without ``close()`` takes its
counters with it: a counter's total may then go down, which the reader's next collection shows
as a reset.

Consumer lag: ``nsq.consumer.lag`` (messages) and ``nsq.consumer.lag.bytes`` per topic,
channel and partition of every live instrumented consumer, as ``nsq-ha stats`` computes it
(:func:`nsq_ha.admin.channel_lag`: on the fork the channel's ``depth`` and ``depth_size`` on the
partition's leader; on vanilla ``depth`` + in flight + deferred summed over its nsqds, without a
partition, and no bytes). nsqd does not send that over the TCP protocol: a background thread
reads each partition leader's HTTP ``/stats`` every ``lag_interval`` seconds
(:func:`~nsq_ha.otel.instrument`, 15 by default), and the gauges report its latest values,
dropped when older than three intervals (:mod:`nsq_ha.otel.lag`; consumers given ``nsqd=``
addresses have none). The client also knows the queue offset of the last message a handler got
on each partition (``nsq.consumer.offset``, on ordered and ``with_offsets`` subscriptions of the
fork, handled through :meth:`Consumer.run`, :meth:`Consumer.run_batches` or
:func:`nsq_ha.otel.processing`, or handed out by ``async for``/``get()``/``get_many()`` once
their process spans end, for consumers started while instrumented).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from nsq_ha import events
from nsq_ha.otel import attributes as a
from nsq_ha.otel.lag import STALE_INTERVALS, LagCache, live_consumers

if TYPE_CHECKING:
    from nsq_ha.consumer import Consumer
    from nsq_ha.producer import Producer

__all__ = ["CONSUMER_OUTCOMES", "MAX_RETIRED", "Metrics"]

#: the consumer counters ``nsq.consumer.messages`` reports, as its ``nsq.message.outcome``
CONSUMER_OUTCOMES = ("finished", "requeued", "timed_out", "given_up", "abandoned")

#: retired (topic, channel) groups kept at most until a collection reports and forgets them;
#: past it the oldest are forgotten first (when nothing collects)
MAX_RETIRED = 1000

_Key = tuple[tuple[str, str | int | bool], ...]
_Group = tuple[str, str]

#: the observable callbacks that report a retired channel (its tallies, its offsets)
_REPORTERS = ("received", "outcome", "offset")

#: seconds: the boundaries the messaging conventions advise for their duration histograms
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)


def _key(attrs: a.Attributes) -> _Key:
    return tuple(sorted(attrs.items()))


class Metrics:
    """Every instrument nsq_ha records, made on one meter; the live clients they read."""

    def __init__(self, meter: Meter, *, lag_interval: float | None = None) -> None:
        """Make the instruments on ``meter``; the lag is read every ``lag_interval`` seconds
        (None: never) into :attr:`lag`."""
        self.active = True
        #: the latest consumer lag per partition, written by :class:`~nsq_ha.otel.lag.LagPoller`
        self.lag = LagCache(STALE_INTERVALS * (lag_interval or 0.0))
        self.producers: weakref.WeakSet[Producer] = weakref.WeakSet()
        self.consumers: weakref.WeakSet[Consumer] = weakref.WeakSet()
        #: counters of closed clients per (topic, channel), None for producers:
        #: (instrument, attributes) -> value; a channel's are dropped once it is forgotten
        self.closed: dict[_Group | None, Counter[tuple[str, _Key]]] = {}
        #: (topic, channel) -> partition -> the queue offset a handler last got, for the
        #: channels of live instrumented consumers (and retired ones, until forgotten)
        self.offsets: dict[_Group, dict[int, int]] = {}
        #: (topic, channel) of the live instrumented consumers, as of their last start or close
        #: (or the last collection)
        self.groups: frozenset[_Group] = frozenset()
        #: retired (topic, channel), oldest first -> per reporting callback, how many times it
        #: had been called at the retirement (its next call reports the channel, once)
        self.retired: dict[_Group, dict[str, int]] = {}
        self._calls: Counter[str] = Counter()  # per reporting callback, the calls so far
        self._lock = threading.Lock()  # the reader's thread collects, the clients' loop counts
        self.duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of a publish call, until nsqd acknowledged or it failed",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.sent = meter.create_counter(
            "messaging.client.sent.messages",
            unit="{message}",
            description="Messages published (error.type set when the publish failed)",
        )
        self.errors = meter.create_counter(
            "nsq.client.publish.errors",
            unit="{error}",
            description="Failed publish calls, by error.type and nsq.error.code",
        )
        self.process_duration = meter.create_histogram(
            "messaging.process.duration",
            unit="s",
            description="Duration of a handler call on a message (or a batch)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.reconnects = meter.create_counter(
            "nsq.client.reconnects",
            unit="{reconnect}",
            description="Connections lost or failed that the client makes again",
        )
        self.leader_changes = meter.create_counter(
            "nsq.client.leader_changes",
            unit="{change}",
            description="Partition leader moves a client followed",
        )
        self.give_ups = meter.create_counter(
            "nsq.client.give_ups",
            unit="{give_up}",
            description="Publishes that exhausted their retries; messages past max_attempts",
        )
        meter.create_observable_counter(
            "nsq.producer.retries",
            [self._retries],
            unit="{retry}",
            description="Publish attempts retried (Producer.stats['retries'])",
        )
        meter.create_observable_counter(
            "messaging.client.consumed.messages",
            [self._received],
            unit="{message}",
            description="Messages delivered to consumers",
        )
        meter.create_observable_counter(
            "nsq.consumer.messages",
            [self._outcomes],
            unit="{message}",
            description="Messages answered or lost, by nsq.message.outcome",
        )
        meter.create_observable_up_down_counter(
            "nsq.consumer.in_flight",
            [self._in_flight],
            unit="{message}",
            description="Messages delivered and not yet answered",
        )
        meter.create_observable_up_down_counter(
            "nsq.consumer.rdy",
            [self._rdy],
            unit="{message}",
            description="The RDY counts consumers gave nsqd, summed",
        )
        meter.create_observable_gauge(
            "nsq.consumer.offset",
            [self._offset],
            unit="By",
            description="Queue offset of the last message a handler got, per partition",
        )
        meter.create_observable_gauge(
            "nsq.consumer.lag",
            [self._lag_messages],
            unit="{message}",
            description="Messages of the partition the channel has not confirmed (nsqd /stats)",
        )
        meter.create_observable_gauge(
            "nsq.consumer.lag.bytes",
            [self._lag_bytes],
            unit="By",
            description="Bytes of the partition the channel has not confirmed (the fork only)",
        )

    # -- clients ------------------------------------------------------------------------------

    def add_producer(self, producer: Producer) -> None:
        """Read ``producer``'s counters from now on."""
        self.producers.add(producer)

    def add_consumer(self, consumer: Consumer) -> None:
        """Read ``consumer``'s counters from now on (its channel, if retired, is live again:
        its totals continue)."""
        group = (consumer.topic, consumer.channel)
        with self._lock:
            self.consumers.add(consumer)
            self.groups = self.groups | {group}
            self.retired.pop(group, None)

    def producer_closed(self, producer: Producer) -> None:
        """Keep a closed producer's counters in the totals."""
        with self._lock:
            if producer in self.producers:
                self.producers.discard(producer)
                tally = self.closed.setdefault(None, Counter())
                for key, value in _producer_counts(producer):
                    tally[key] += value

    def consumer_closed(self, consumer: Consumer) -> None:
        """Keep a closed consumer's counters in its channel's totals; retire the channel when
        no live consumer has it any more."""
        with self._lock:
            if consumer in self.consumers:
                self.consumers.discard(consumer)
                tally = self.closed.setdefault((consumer.topic, consumer.channel), Counter())
                for key, value in _consumer_counts(consumer):
                    if key[0] != "in_flight":  # what it held went back to nsqd
                        tally[key] += value
            self._retire_gone()

    def remember_offset(self, topic: str, channel: str, partition: int, offset: int) -> None:
        """The queue offset a handler just got on ``topic``/``channel``'s ``partition`` (kept
        only for the channel of a live instrumented consumer)."""
        group = (topic, channel)
        with self._lock:
            if group in self.groups:
                self.offsets.setdefault(group, {})[partition] = offset

    # -- retired channels (called with the lock held) -------------------------------------------

    def _retire_gone(self) -> None:
        """Retire the channels no live consumer has any more (closed, or dropped unclosed)."""
        live = frozenset((c.topic, c.channel) for c in live_consumers(self.consumers))
        for group in self.groups - live:
            self.retired.pop(group, None)  # the newest retired, last
            self.retired[group] = {name: self._calls[name] for name in _REPORTERS}
        self.groups = live
        while len(self.retired) > MAX_RETIRED:
            self._forget(next(iter(self.retired)))

    def _forget(self, group: _Group) -> None:
        self.retired.pop(group, None)
        self.closed.pop(group, None)
        self.offsets.pop(group, None)

    def _begin(self, reporter: str) -> frozenset[_Group]:
        """Count a call of ``reporter`` (one of the reporting callbacks): the retired channels
        it reported already, not to report again."""
        self._retire_gone()  # also those of consumers dropped without close()
        call = self._calls[reporter]
        self._calls[reporter] = call + 1
        reported = []
        for group, calls in self.retired.items():  # oldest first: those reported come first
            if calls[reporter] >= call:
                break
            reported.append(group)
        return frozenset(reported)

    def _end(self) -> None:
        """Forget the retired channels every reporting callback has reported."""
        while self.retired:
            group, calls = next(iter(self.retired.items()))
            if any(self._calls[name] <= calls[name] for name in _REPORTERS):
                break
            self._forget(group)

    # -- events -------------------------------------------------------------------------------

    def on_event(self, event: events.Event) -> None:
        """The :mod:`nsq_ha.events` listener."""
        attrs: a.Attributes = {a.SYSTEM: a.SYSTEM_NAME, a.NSQ_ROLE: event.role}
        attrs[a.DESTINATION] = event.topic
        if event.partition is not None:
            attrs[a.PARTITION] = str(event.partition)
        if isinstance(event, events.LeaderChanged):
            self.leader_changes.add(1, attrs)
        elif isinstance(event, events.Reconnecting):
            self.reconnects.add(1, attrs)
        else:
            self.give_ups.add(1, attrs)

    # -- observable callbacks -----------------------------------------------------------------

    def _observe(
        self,
        name: str,
        live: Iterable[tuple[tuple[str, _Key], int]],
        reported: frozenset[_Group] = frozenset(),
    ) -> list[Any]:
        totals: Counter[_Key] = Counter()
        for group, tally in self.closed.items():
            if group not in reported:
                for (metric, key), value in tally.items():
                    if metric == name:
                        totals[key] += value
        for (metric, key), value in live:
            if metric == name:
                totals[key] += value
        return [Observation(value, dict(key)) for key, value in totals.items()]

    def _live_consumers(self) -> Iterator[tuple[tuple[str, _Key], int]]:
        for consumer in live_consumers(self.consumers):
            yield from _consumer_counts(consumer)

    def _retries(self, options: CallbackOptions) -> Iterable[Observation]:
        if not self.active:
            return []
        with self._lock:
            live = (kv for p in list(self.producers) for kv in _producer_counts(p))
            return self._observe("retries", live)

    def _received(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._report("received")

    def _outcomes(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._report("outcome")

    def _report(self, name: str) -> list[Any]:
        if not self.active:
            return []
        with self._lock:
            found = self._observe(name, self._live_consumers(), self._begin(name))
            self._end()
        return found

    def _in_flight(self, options: CallbackOptions) -> Iterable[Observation]:
        if not self.active:
            return []
        with self._lock:
            return self._observe("in_flight", self._live_consumers())

    def _rdy(self, options: CallbackOptions) -> Iterable[Observation]:
        if not self.active:
            return []
        totals: Counter[_Key] = Counter()
        for consumer in live_consumers(self.consumers):
            totals[_key(_consumer_attributes(consumer))] += consumer.stats["rdy"]
        return [Observation(value, dict(key)) for key, value in totals.items()]

    def _offset(self, options: CallbackOptions) -> Iterable[Observation]:
        if not self.active:
            return []
        with self._lock:
            reported = self._begin("offset")
            found = [
                Observation(
                    offset,
                    {
                        a.SYSTEM: a.SYSTEM_NAME,
                        a.DESTINATION: topic,
                        a.CONSUMER_GROUP: channel,
                        a.PARTITION: str(partition),
                    },
                )
                for (topic, channel), partitions in self.offsets.items()
                if (topic, channel) not in reported
                for partition, offset in partitions.items()
            ]
            self._end()
        return found

    def _lag_messages(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._lag_observations(in_bytes=False)

    def _lag_bytes(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._lag_observations(in_bytes=True)

    def _lag_observations(self, *, in_bytes: bool) -> list[Observation]:
        if not self.active:
            return []
        found = []
        for (topic, channel, partition), lag in self.lag.fresh(time.monotonic()):
            value = lag.bytes if in_bytes else lag.messages
            if value is None:
                continue
            attrs: a.Attributes = {
                a.SYSTEM: a.SYSTEM_NAME,
                a.DESTINATION: topic,
                a.CONSUMER_GROUP: channel,
            }
            if partition is not None:
                attrs[a.PARTITION] = str(partition)
            found.append(Observation(value, attrs))
        return found


def _consumer_attributes(consumer: Consumer) -> a.Attributes:
    return {
        a.SYSTEM: a.SYSTEM_NAME,
        a.DESTINATION: consumer.topic,
        a.CONSUMER_GROUP: consumer.channel,
    }


def _producer_counts(producer: Producer) -> Iterator[tuple[tuple[str, _Key], int]]:
    yield ("retries", _key({a.SYSTEM: a.SYSTEM_NAME})), producer.stats["retries"]


def _consumer_counts(consumer: Consumer) -> Iterator[tuple[tuple[str, _Key], int]]:
    """(instrument, attributes) -> value of every per-partition counter of ``consumer``."""
    base = _consumer_attributes(consumer)
    for partition, counts in consumer.stats["partitions"].items():
        attrs = dict(base)
        if partition >= 0:
            attrs[a.PARTITION] = str(partition)
        yield ("received", _key(attrs)), counts.get("received", 0)
        yield ("in_flight", _key(attrs)), counts.get("in_flight", 0)
        for outcome in CONSUMER_OUTCOMES:
            yield ("outcome", _key({**attrs, a.NSQ_OUTCOME: outcome})), counts.get(outcome, 0)
