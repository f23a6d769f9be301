"""Benchmark drivers for nsq_ha (and the raw-socket bound), one workload per process.

``python -m nsq_ha.bench.drivers '<spec JSON>'`` runs the workload the spec names and prints
one result line (:func:`nsq_ha.bench.measure.emit`). The runner starts a fresh process for every
run so that CPU and memory figures belong to that run alone.

Clients (``spec["client"]``): ``nsq_ha`` (asyncio), ``nsq_ha-batch`` (``run_batches``),
``nsq_ha-sync`` (the blocking facade), ``raw`` (a blocking socket that does the least a
client can: the bound for ordered consumption) and ``floor`` (the least an event-loop client
can do per ordered message). The asyncio drivers run on uvloop's event loop when the spec says
``"loop": "uvloop"`` (the bench's ``nsq_ha-uvloop`` and ``floor-uvloop`` clients).
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

from nsq_ha.bench.measure import (
    Span,
    body,
    emit,
    latency_ns,
    latency_summary,
    read_spec,
    rss_mb,
    stamped_body,
)
from nsq_ha.connection import ConnectionConfig
from nsq_ha.consumer import Consumer
from nsq_ha.errors import FinFailedError
from nsq_ha.lookup import LookupClient
from nsq_ha.producer import Producer
from nsq_ha.protocol import MAGIC_V2
from nsq_ha.protocol.commands import Identify, Rdy, SubOrdered
from nsq_ha.protocol.error_frames import parse_error_frame
from nsq_ha.protocol.frames import HEARTBEAT, FrameType


def _where(spec: dict[str, Any]) -> dict[str, Any]:
    """``lookupd=`` when the spec names one (the partition-aware path), else ``nsqd=``.

    With ``lookup_timeout`` (the CPU mode: under valgrind, the first ``/lookup``, httpx's
    set-up included, outlasts the lookup client's 5 s), a :class:`LookupClient` with that
    deadline instead; it lives as long as the driver's process, which is one run."""
    if spec.get("lookupd"):
        if spec.get("lookup_timeout"):
            return {"lookup": LookupClient(spec["lookupd"], timeout=spec["lookup_timeout"])}
        return {"lookupd": spec["lookupd"]}
    return {"nsqd": spec["nsqd"]}


async def _publish_tasks(
    producer: Producer, spec: dict[str, Any], data: bytes, span: Span
) -> dict[str, Any]:
    """The timed part of the one-message workloads: ``n`` ``publish()`` calls from
    ``concurrency`` tasks (sharding keys ``i % 512`` when keyed)."""
    n, tasks, topic = spec["n"], spec["concurrency"], spec["topic"]
    keyed = bool(spec.get("keyed"))

    async def worker(first: int, count: int) -> None:
        if keyed:
            for i in range(first, first + count):
                await producer.publish(topic, data, sharding_key=i % 512)
        else:
            for _ in range(count):
                await producer.publish(topic, data)

    share = n // tasks
    span.start()
    await asyncio.gather(*(worker(k * share, share) for k in range(tasks)))
    return span.stop(share * tasks, commands=producer.stats["commands"])


async def publish_one(spec: dict[str, Any]) -> dict[str, Any]:
    """``n`` one-message ``publish()`` calls from ``concurrency`` tasks (keyed if asked), after
    one publish (keyed if asked) that connects and looks up outside the timed part."""
    data = body(spec["size"])
    async with Producer(**_where(spec)) as producer:
        await producer.publish(spec["topic"], data, sharding_key=0 if spec.get("keyed") else None)
        return await _publish_tasks(producer, spec, data, Span())


async def publish_cold(spec: dict[str, Any]) -> dict[str, Any]:
    """As :func:`publish_one`, from a fresh producer: the clock starts before its first
    publish, so the lookup and the connections to the partitions are timed."""
    async with Producer(**_where(spec)) as producer:
        return await _publish_tasks(producer, spec, body(spec["size"]), Span())


async def publish_many(spec: dict[str, Any]) -> dict[str, Any]:
    """``n`` messages as ``publish_many`` calls of ``batch``, ``concurrency`` calls at once."""
    n, tasks, topic, batch = spec["n"], spec["concurrency"], spec["topic"], spec["batch"]
    bodies = [body(spec["size"])] * batch
    span = Span()
    async with Producer(**_where(spec)) as producer:
        await producer.publish(topic, bodies[0])
        calls = n // batch
        per_task = calls // tasks

        async def worker() -> None:
            for _ in range(per_task):
                await producer.publish_many(topic, bodies)

        span.start()
        await asyncio.gather(*(worker() for _ in range(tasks)))
        result = span.stop(per_task * tasks * batch)
    return result


def _consumer(spec: dict[str, Any], **options: Any) -> Consumer:
    if spec.get("unbuffered"):  # nsqd buffers 16 KiB of deliveries (up to 250 ms) by default
        options["connection"] = ConnectionConfig(output_buffer_size=-1)
    return Consumer(
        spec["topic"],
        spec["channel"],
        max_in_flight=spec["rdy"],
        **_where(spec),
        **options,
    )


async def consume(spec: dict[str, Any]) -> dict[str, Any]:
    """``async for`` over ``n`` prefilled messages, finishing each."""
    n = spec["n"]
    span = Span()
    got = 0
    async with _consumer(spec, ordered=spec.get("ordered")) as consumer:
        async for message in consumer:
            if got == 0:
                span.start()  # every consume driver times from its first message
            await message.finish()
            got += 1
            if got >= n:
                break
        result = span.stop(got - 1)
    return result


async def consume_batches(spec: dict[str, Any]) -> dict[str, Any]:
    """``run_batches`` (batches of 100) over ``n`` prefilled messages; returning finishes."""
    n = spec["n"]
    span = Span()
    got = 0
    done = asyncio.Event()
    result: dict[str, Any] = {}

    first = 0

    def handler(messages: list[Any]) -> None:
        nonlocal got, first, result
        if got == 0:
            span.start()  # the first batch arrived before the clock started: not counted
            first = len(messages)
        got += len(messages)
        if got >= n and not done.is_set():
            result = span.stop(got - first)
            done.set()

    async with _consumer(spec) as consumer:
        runner = asyncio.create_task(consumer.run_batches(handler, max_size=100))
        await done.wait()
        runner.cancel()
    return result


def consume_sync(spec: dict[str, Any]) -> dict[str, Any]:
    """The blocking facade: ``for message in consumer: message.finish()``."""
    from nsq_ha.sync import Consumer as SyncConsumer

    n = spec["n"]
    span = Span()
    got = 0
    with SyncConsumer(
        spec["topic"], spec["channel"], max_in_flight=spec["rdy"], **_where(spec)
    ) as consumer:
        for message in consumer:
            if got == 0:
                span.start()
            message.finish()
            got += 1
            if got >= n:
                break
        result = span.stop(got - 1)
    return result


async def latency(spec: dict[str, Any]) -> dict[str, Any]:
    """Publish stamped one-message publishes at ``rate``/s for ``seconds``; consume them."""
    rate, total, topic = spec["rate"], int(spec["rate"] * spec["seconds"]), spec["topic"]
    size = spec["size"]
    loop = asyncio.get_running_loop()
    samples: list[int] = []
    errors = 0
    async with Producer(**_where(spec)) as producer, _consumer(spec) as consumer:
        await consumer.start()
        await producer.publish(topic, stamped_body(size))  # connects; one of the ``total``
        pending: set[asyncio.Task[Any]] = set()

        def settled(task: asyncio.Task[Any]) -> None:
            nonlocal errors
            pending.discard(task)
            if task.cancelled() or task.exception() is not None:
                errors += 1

        async def produce() -> None:
            start, sent = loop.time(), 1
            while sent < total:
                due = min(total, 1 + int((loop.time() - start) * rate))
                while sent < due:
                    task = loop.create_task(producer.publish(topic, stamped_body(size)))
                    pending.add(task)
                    task.add_done_callback(settled)
                    sent += 1
                await asyncio.sleep(0.0005)

        async def receive() -> None:
            async for message in consumer:
                samples.append(latency_ns(message.body))
                await message.finish()
                if len(samples) >= total:
                    return

        span = Span()
        span.start()
        await asyncio.gather(produce(), receive())
        result = span.stop(len(samples), errors=errors, **latency_summary(samples))
    return result


async def hold(spec: dict[str, Any]) -> dict[str, Any]:
    """Receive ``n`` messages with ``max_in_flight`` = ``rdy`` and hold them all unanswered."""
    n = spec["n"]
    baseline = rss_mb()
    span = Span()
    span.start()
    held: list[Any] = []
    async with _consumer(spec, drain_timeout=1.0) as consumer:
        async for message in consumer:
            held.append(message)
            if len(held) >= n:
                break
        result = span.stop(len(held), baseline_mb=baseline)
        for message in held:
            await message.finish()
    return result


def _ordered_opening(spec: dict[str, Any], name: str) -> bytes:
    """What the raw and floor clients send first: magic, IDENTIFY, SUB_ORDERED, RDY 1."""
    identify = {"client_id": name, "hostname": name, "feature_negotiation": False}
    sub = SubOrdered(spec["topic"], spec["channel"], spec.get("partition", 0))
    return MAGIC_V2 + Identify.of(identify).encode() + sub.encode() + Rdy(1).encode()


def raw_ordered(spec: dict[str, Any]) -> dict[str, Any]:
    """The one-round-trip-per-message bound: a blocking socket, SUB_ORDERED, RDY 1, FIN each.

    It does nothing but read a frame and answer it, so its rate is what nsqd's ordered delivery
    allows on this machine; :func:`consume` with ``ordered`` is measured against it.
    """
    host, _, port = spec["nsqd"].rpartition(":")
    n = spec["n"]
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stream = sock.makefile("rb")
    size_type = struct.Struct(">ii")
    sock.sendall(_ordered_opening(spec, "raw"))
    span = Span()
    got = 0
    while got < n:
        size, kind = size_type.unpack(stream.read(8))
        data = stream.read(size - 4)
        if kind == FrameType.MESSAGE:  # FIN it (id at bytes 10..26)
            if got == 0:
                span.start()
            sock.sendall(b"FIN " + data[10:26] + b"\n")  # the least: no checked encoder
            got += 1
        elif kind == FrameType.ERROR and type(parse_error_frame(data)) is not FinFailedError:
            # (the fork may deliver a message it had read ahead twice: the second FIN fails)
            raise RuntimeError(f"nsqd error: {data!r}")
        elif data == HEARTBEAT:
            sock.sendall(b"NOP\n")
    result = span.stop(got - 1)
    sock.close()
    return result


_SIZE_TYPE = struct.Struct(">ii")


class _FloorProtocol(asyncio.BufferedProtocol):
    """The read side of :func:`asyncio_floor`: frames parsed in place, messages queued, the
    waiting task woken."""

    def __init__(self, on_error: Callable[[bytes], None]) -> None:
        self.buffer = bytearray(1 << 16)
        self.filled = 0
        self.messages: list[bytes] = []
        self.waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.on_error = on_error

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buffer)[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        view, start = memoryview(self.buffer), 0
        while self.filled - start >= 8:
            size, kind = _SIZE_TYPE.unpack_from(self.buffer, start)
            if self.filled - start < size + 4:
                break
            data = bytes(view[start + 8 : start + 4 + size])
            start += 4 + size
            if kind == FrameType.MESSAGE:
                self.messages.append(data)
            elif kind == FrameType.ERROR:
                self.on_error(data)
            elif data == HEARTBEAT and self.transport is not None:
                self.transport.write(b"NOP\n")
        view.release()
        if start:
            self.buffer[: self.filled - start] = self.buffer[start : self.filled]
            self.filled -= start
        waiter = self.waiter
        if self.messages and waiter is not None and not waiter.done():
            waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc or ConnectionError("nsqd closed the connection"))


async def asyncio_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """The least an ``async for`` client does per ordered message, on an event loop: the read
    callback parses the frame and wakes a waiting task, which sends the FIN (SUB_ORDERED,
    RDY 1, as :func:`raw_ordered`). No decoding, bookkeeping or checks: what nsq_ha's ordered
    ``async for`` costs beyond this is nsq_ha's; what this costs beyond :func:`raw_ordered`
    is the event loop's (the bench's ``floor`` and ``floor-uvloop`` clients)."""
    loop = asyncio.get_running_loop()
    host, _, port = spec["nsqd"].rpartition(":")
    n = spec["n"]

    def on_error(data: bytes) -> None:
        if type(parse_error_frame(data)) is not FinFailedError:  # as in raw_ordered
            raise RuntimeError(f"nsqd error: {data!r}")

    transport, proto = await loop.create_connection(
        lambda: _FloorProtocol(on_error), host, int(port)
    )
    transport.write(_ordered_opening(spec, "floor"))
    span = Span()
    got = 0
    messages = proto.messages
    try:
        while got < n:
            while not messages:
                proto.waiter = loop.create_future()
                await proto.waiter
            data = messages.pop(0)
            if got == 0:
                span.start()
            transport.write(b"FIN " + data[10:26] + b"\n")  # the least: no checked encoder
            got += 1
        return span.stop(got - 1)
    finally:
        transport.close()


_ASYNC = {
    ("nsq_ha", "pub1"): publish_one,
    ("nsq_ha", "pub1-cold"): publish_cold,
    ("nsq_ha", "pubmany"): publish_many,
    ("nsq_ha", "consume"): consume,
    ("nsq_ha-batch", "consume"): consume_batches,
    ("nsq_ha", "latency"): latency,
    ("nsq_ha", "hold"): hold,
    ("floor", "consume"): asyncio_floor,
}
_BLOCKING: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("nsq_ha-sync", "consume"): consume_sync,
    ("raw", "consume"): raw_ordered,
    ("nsq_ha", "spark-read"): lambda spec: _spark(spec, write=False),
    ("nsq_ha", "spark-write"): lambda spec: _spark(spec, write=True),
    ("nsq_ha", "spark-read-ordered"): lambda spec: _spark(spec, write=False),
    ("nsq_ha", "dev-ordered"): lambda spec: _spark_module().ordered_consume(spec),
    ("nsq_ha", "dev-consume"): lambda spec: _spark_module().plain_consume(spec),
    ("nsq_ha", "dev-write"): lambda spec: _spark_module().keyed_publish(spec),
}


def _spark_module() -> Any:
    """:mod:`nsq_ha.bench.spark_drivers`, imported only for its workloads."""
    from nsq_ha.bench import spark_drivers

    return spark_drivers


def _spark(spec: dict[str, Any], *, write: bool) -> dict[str, Any]:
    """A Spark workload (:mod:`nsq_ha.bench.spark_drivers`)."""
    drivers = _spark_module()
    result: dict[str, Any] = drivers.spark_write(spec) if write else drivers.spark_read(spec)
    return result


def _loop_factory(spec: dict[str, Any]) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop the spec asks for: asyncio's own, or uvloop's (``"loop": "uvloop"``)."""
    if spec.get("loop") != "uvloop":
        return None
    import uvloop

    return uvloop.new_event_loop


def main() -> None:
    """Run the spec's workload; with ``NSQ_HA_BENCH_PROFILE=<dir>`` under cProfile, the stats
    written to ``<dir>/<client>-<workload>-<pid>.prof`` (read them with ``pstats``)."""
    spec = read_spec()
    key = (spec["client"], spec["workload"])
    if key not in _ASYNC and key not in _BLOCKING:
        raise SystemExit(f"no nsq_ha driver for client {key[0]!r} workload {key[1]!r}")
    profile_dir = os.environ.get("NSQ_HA_BENCH_PROFILE")
    profiler = cProfile.Profile() if profile_dir else None
    if profiler is not None:
        profiler.enable()
    if key in _ASYNC:
        with asyncio.Runner(loop_factory=_loop_factory(spec)) as runner:
            result = runner.run(_ASYNC[key](spec))
    else:
        result = _BLOCKING[key](spec)
    if profiler is not None and profile_dir:
        profiler.disable()
        name = f"{key[0]}-{key[1]}-{os.getpid()}.prof"
        profiler.dump_stats(os.path.join(profile_dir, name))
    emit(result)


if __name__ == "__main__":
    main()
