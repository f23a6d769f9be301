"""Which ``nsq_ha`` modules one warm publish and one warm delivery pass through.

Against a vanilla nsqd started here (the built 1.3.0 binaries, ``make servers``), with
``sys.setprofile`` on the event loop's thread for exactly:

* **publish**: one ``await producer.publish(topic, body)`` of a warm producer, from the call
  until it returns (the loop runs the sender, the writer and the reader of the answer meanwhile);
* **delivery**: one message from the socket read through ``async for`` to ``finish()``
  returning, on a warm consumer (the message is put into nsqd over HTTP by a thread, which is
  not profiled).

Every Python function called in that span is recorded by the file it lives in; files under
``nsq_ha/`` count, the embedded broker's excluded. ``--calls`` prints the functions too. Under
the compiled build the tool runs itself again with ``NSQ_HA_PURE=1``: mypyc's modules have no
Python frames, and the modules a message passes through are the same sources either way.

    .venv/bin/python tools/journey.py [--calls]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

import nsq_ha
from nsq_ha import Consumer, Producer
from nsq_ha._compiled_finder import PURE_ENV, active
from nsq_ha.testing.build import find_built
from nsq_ha.testing.recipes import VANILLA
from nsq_ha.testing.servers import VanillaCluster

PACKAGE = Path(nsq_ha.__file__).resolve().parent
EXCLUDED = ("devcluster",)


class Recorder:
    """The ``nsq_ha`` functions called on this thread while it is on."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        try:
            rel = path.resolve().relative_to(PACKAGE)
        except ValueError:
            return
        if rel.parts[0] in EXCLUDED:
            return
        self.calls[(str(Path("nsq_ha") / rel), frame.f_code.co_qualname)] += 1

    async def over(self, step: Callable[[], Awaitable[Any]]) -> Any:
        sys.setprofile(self._profile)
        try:
            return await step()
        finally:
            sys.setprofile(None)

    def modules(self) -> list[str]:
        return sorted({module for module, _ in self.calls})


def _http_pub(url: str) -> None:
    httpx.post(url, content=b"journey", timeout=10).raise_for_status()


async def publish_journey(nsqd: str, topic: str) -> Recorder:
    recorder = Recorder()
    async with Producer(nsqd=nsqd) as producer:
        for _ in range(3):  # warm: connected, the topic known, every lazy import done
            await producer.publish(topic, b"warm")
        await recorder.over(lambda: producer.publish(topic, b"journey"))
    return recorder


async def delivery_journey(nsqd: str, http: str, topic: str) -> Recorder:
    recorder = Recorder()
    url = f"{http}/pub?topic={topic}"
    async with Consumer(topic, "journey", nsqd=nsqd, max_in_flight=1) as consumer:
        messages = consumer.__aiter__()
        for _ in range(3):  # warm
            await asyncio.to_thread(_http_pub, url)
            message = await messages.__anext__()
            await message.finish()
        # the thread puts the message into nsqd; the loop's thread is profiled from the moment
        # before the socket read that brings it to finish() returning
        thread = threading.Thread(target=_http_pub, args=(url,))

        async def one() -> None:
            thread.start()
            message = await messages.__anext__()
            await message.finish()

        await recorder.over(one)
        thread.join(10)
    return recorder


def report(name: str, recorder: Recorder, calls: bool) -> None:
    modules = recorder.modules()
    print(f"{name}: {len(modules)} modules")
    for module in modules:
        functions = sorted((q, n) for (m, q), n in recorder.calls.items() if m == module)
        print(f"  {module}")
        if calls:
            for qualname, count in functions:
                print(f"      {qualname} x{count}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", action="store_true", help="print the functions too")
    args = parser.parse_args()
    if active():  # compiled modules have no frames to profile: count the same sources as Python
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, PURE_ENV: "1"})  # noqa: S606 (this interpreter, again)
    binaries = find_built(VANILLA)
    if binaries is None:
        sys.exit("vanilla nsqd is not built: run `make servers`")
    with VanillaCluster(binaries, node_count=1) as cluster:
        node = cluster.nodes[0]
        publish = asyncio.run(publish_journey(node.tcp_address, "journey_pub"))
        delivery = asyncio.run(delivery_journey(node.tcp_address, node.http_url, "journey_sub"))
    report("publish (Producer.publish, warm)", publish, args.calls)
    report("delivery (socket read -> async for -> finish())", delivery, args.calls)


if __name__ == "__main__":
    main()
