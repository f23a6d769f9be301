"""Benchmark drivers for the peer Python clients: pynsq (tornado), gnsq (gevent), ansq (asyncio).

The runner executes this file with the peers' virtualenv (``python peers.py '<spec JSON>'``),
where nsq_ha is not installed: it imports nothing from nsq_ha but :mod:`measure`, which sits
next to it and uses the standard library only. Each client is driven the way its
documentation shows, with the same concurrency, batch size and RDY as nsq_ha's driver.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

if __package__:
    from nsq_ha.bench import measure
else:  # run as a script: this file's directory is sys.path[0]
    import measure  # type: ignore[import-not-found, no-redef]


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# -- pynsq 0.9 (tornado callbacks) ----------------------------------------------------------------


def pynsq_run(spec: dict[str, Any]) -> dict[str, Any]:
    import nsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()
    workload, topic, size = spec["workload"], spec["topic"], spec["size"]
    span = measure.Span()
    out: dict[str, Any] = {}
    state = {"sent": 0, "acked": 0, "got": 0, "errors": 0}
    held: list[Any] = []
    samples: list[int] = []

    def finish(**extra: Any) -> None:
        out.update(span.stop(**extra))
        loop.stop()

    if workload in ("pub1", "pubmany"):
        writer = nsq.Writer([spec["nsqd"]])
        batch = spec["batch"] if workload == "pubmany" else 1
        calls = spec["n"] // batch
        data = measure.body(size)
        bodies = [data] * batch

        def acked(conn: Any, answer: Any) -> None:
            state["acked"] += 1
            if isinstance(answer, Exception):
                state["errors"] += 1
            if state["sent"] < calls:
                send()
            elif state["acked"] == calls:
                finish(count=calls * batch, errors=state["errors"])

        def send() -> None:
            state["sent"] += 1
            if batch == 1:
                writer.pub(topic, data, acked)
            else:
                writer.mpub(topic, bodies, acked)

        def begin() -> None:
            if not any(c.connected() for c in writer.conns.values()):
                loop.call_later(0.01, begin)
                return
            span.start()
            for _ in range(min(spec["concurrency"], calls)):
                send()

        loop.add_callback(begin)
        loop.start()
        return out

    if workload in ("consume", "hold", "latency"):
        target = spec["n"] if workload != "latency" else int(spec["rate"] * spec["seconds"])
        baseline = measure.rss_mb()

        def handler(message: Any) -> bool | None:
            if state["got"] == 0 and workload == "consume":
                span.start()  # consume runs time from the first message (as nsq_ha's)
            state["got"] += 1
            if workload == "hold":
                message.enable_async()
                held.append(message)
            elif workload == "latency":
                samples.append(measure.latency_ns(message.body))
            if state["got"] == target:
                extra: dict[str, Any] = {"count": target - (workload == "consume")}
                if workload == "hold":
                    extra["baseline_mb"] = baseline
                if workload == "latency":
                    extra.update(measure.latency_summary(samples))
                    extra["errors"] = state["errors"]
                finish(**extra)
            return None if workload == "hold" else True

        nsq.Reader(
            topic=topic,
            channel=spec["channel"],
            message_handler=handler,
            nsqd_tcp_addresses=[spec["nsqd"]],
            max_in_flight=spec["rdy"],
            **({"output_buffer_size": 64} if spec.get("unbuffered") else {}),
        )
        if workload == "latency":
            writer = nsq.Writer([spec["nsqd"]])

            def acked(conn: Any, answer: Any) -> None:
                if isinstance(answer, Exception):
                    state["errors"] += 1

            def tick() -> None:
                due = min(target, 1 + int((loop.time() - state["t0"]) * spec["rate"]))
                while state["sent"] < due:
                    writer.pub(topic, measure.stamped_body(size), acked)
                    state["sent"] += 1
                if state["sent"] < target:
                    loop.call_later(0.0005, tick)

            def begin() -> None:
                if not any(c.connected() for c in writer.conns.values()):
                    loop.call_later(0.01, begin)
                    return
                state["t0"] = loop.time()
                span.start()
                tick()

            loop.add_callback(begin)
        else:
            span.start()
        loop.start()
        return out
    raise SystemExit(f"pynsq: no driver for {workload!r}")


# -- gnsq 1.0 (gevent) -----------------------------------------------------------------------------


def gnsq_run(spec: dict[str, Any]) -> dict[str, Any]:
    import gevent
    import gevent.event
    import gnsq

    workload, topic, size = spec["workload"], spec["topic"], spec["size"]
    span = measure.Span()
    if workload in ("pub1", "pubmany"):
        producer = gnsq.Producer([spec["nsqd"]])
        producer.start()
        data = measure.body(size)
        producer.publish(topic, data)  # connected
        batch = spec["batch"] if workload == "pubmany" else 1
        per_task = spec["n"] // batch // spec["concurrency"]
        bodies = [data] * batch

        def worker() -> None:
            for _ in range(per_task):
                if batch == 1:
                    producer.publish(topic, data)
                else:
                    producer.multipublish(topic, bodies)

        span.start()
        gevent.joinall([gevent.spawn(worker) for _ in range(spec["concurrency"])], raise_error=True)
        result = span.stop(count=per_task * spec["concurrency"] * batch)
        producer.close()
        return result

    if workload in ("consume", "hold", "latency"):
        target = spec["n"] if workload != "latency" else int(spec["rate"] * spec["seconds"])
        baseline = measure.rss_mb()
        done = gevent.event.Event()
        held: list[Any] = []
        samples: list[int] = []
        got = [0]
        consumer = gnsq.Consumer(
            topic,
            spec["channel"],
            nsqd_tcp_addresses=[spec["nsqd"]],
            max_in_flight=spec["rdy"],
            **({"output_buffer_size": 64} if spec.get("unbuffered") else {}),
        )

        @consumer.on_message.connect  # type: ignore[untyped-decorator]
        def handler(consumer: Any, message: Any) -> None:
            if got[0] == 0 and workload == "consume":
                span.start()
            got[0] += 1
            if workload == "hold":
                message.enable_async()
                held.append(message)
            elif workload == "latency":
                samples.append(measure.latency_ns(message.body))
            if got[0] == target:
                done.set()

        span.start()
        consumer.start(block=False)
        extra: dict[str, Any] = {}
        if workload == "latency":
            producer = gnsq.Producer([spec["nsqd"]])
            producer.start()
            producer.publish(topic, measure.stamped_body(size))  # connects; one of the target
            span.start()
            start, sent = gevent.get_hub().loop.now(), 1
            while sent < target:
                due = min(target, 1 + int((gevent.get_hub().loop.now() - start) * spec["rate"]))
                while sent < due:
                    producer.publish(topic, measure.stamped_body(size), block=False)
                    sent += 1
                gevent.sleep(0.0005)
                gevent.get_hub().loop.update_now()
        done.wait()
        if workload == "hold":
            extra["baseline_mb"] = baseline
        if workload == "latency":
            extra.update(measure.latency_summary(samples))
        result = span.stop(count=got[0] - (workload == "consume"), **extra)
        consumer.close()
        return result
    raise SystemExit(f"gnsq: no driver for {workload!r}")


# -- ansq 0.3 (asyncio) ----------------------------------------------------------------------------


async def ansq_run(spec: dict[str, Any]) -> dict[str, Any]:
    from ansq import create_reader, create_writer

    workload, topic, size = spec["workload"], spec["topic"], spec["size"]
    span = measure.Span()
    if workload in ("pub1", "pubmany"):
        writer = await create_writer(nsqd_tcp_addresses=[spec["nsqd"]])
        data = measure.body(size)
        await writer.pub(topic, data)
        batch = spec["batch"] if workload == "pubmany" else 1
        per_task = spec["n"] // batch // spec["concurrency"]
        bodies = [data] * batch

        async def worker() -> None:
            for _ in range(per_task):
                if batch == 1:
                    await writer.pub(topic, data)
                else:
                    await writer.mpub(topic, *bodies)

        span.start()
        await asyncio.gather(*(worker() for _ in range(spec["concurrency"])))
        result = span.stop(count=per_task * spec["concurrency"] * batch)
        await writer.close()
        return result

    if workload in ("consume", "hold", "latency"):
        target = spec["n"] if workload != "latency" else int(spec["rate"] * spec["seconds"])
        baseline = measure.rss_mb()
        held: list[Any] = []
        samples: list[int] = []
        span.start()
        reader = await create_reader(
            topic=topic, channel=spec["channel"], nsqd_tcp_addresses=[spec["nsqd"]]
        )
        for connection in reader._connections.values():  # no public RDY setter in ansq 0.3
            await connection.rdy(spec["rdy"])
        producing: asyncio.Task[None] | None = None
        if workload == "latency":
            writer = await create_writer(nsqd_tcp_addresses=[spec["nsqd"]])
            loop = asyncio.get_running_loop()
            pending: set[asyncio.Task[Any]] = set()

            async def produce() -> None:
                start, sent = loop.time(), 0
                while sent < target:
                    due = min(target, 1 + int((loop.time() - start) * spec["rate"]))
                    while sent < due:
                        task = loop.create_task(writer.pub(topic, measure.stamped_body(size)))
                        pending.add(task)
                        task.add_done_callback(pending.discard)
                        sent += 1
                    await asyncio.sleep(0.0005)

            span.start()
            producing = asyncio.create_task(produce())
        got = 0
        async for message in reader.messages():
            if got == 0 and workload == "consume":
                span.start()
            got += 1
            if workload == "hold":
                held.append(message)
            else:
                if workload == "latency":
                    samples.append(measure.latency_ns(message.body))
                await message.fin()
            if got >= target:
                break
        extra: dict[str, Any] = {}
        if workload == "hold":
            extra["baseline_mb"] = baseline
        if workload == "latency":
            extra.update(measure.latency_summary(samples))
        result = span.stop(count=got - (workload == "consume"), **extra)
        if producing is not None:
            await producing
        await reader.close()
        return result
    raise SystemExit(f"ansq: no driver for {workload!r}")


def main() -> None:
    spec = measure.read_spec()
    client = spec["client"]
    if client == "pynsq":
        result = pynsq_run(spec)
    elif client == "gnsq":
        result = gnsq_run(spec)
    elif client == "ansq":
        result = asyncio.run(ansq_run(spec))
    else:
        raise SystemExit(f"unknown peer client {client!r}")
    measure.emit(result)
    sys.exit(0)


if __name__ == "__main__":
    main()
