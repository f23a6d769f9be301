"""The blocking facade (``nsq_ha.sync``) against real vanilla nsqd: nothing queued is lost at
exit, a forked child never hangs, and bad durations are refused before anything is sent."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import httpx
import pytest

import nsq_ha
from nsq_ha import sync
from nsq_ha.errors import ConfigError
from nsq_ha.testing.servers import VanillaCluster

pytestmark = pytest.mark.vanilla

#: the checkout whose ``nsq_ha`` this test imported: the child scripts import the same one
_ROOT = Path(nsq_ha.__file__).resolve().parents[1]


def _topic() -> str:
    return f"sh_{uuid.uuid4().hex[:10]}"


def _stored(cluster: VanillaCluster, topic: str) -> int:
    """How many messages the nsqd nodes stored for ``topic`` (their ``message_count``)."""
    total = 0
    for node in cluster.nodes:
        data = httpx.get(
            f"{node.http_url}/stats", params={"format": "json", "topic": topic}, timeout=5
        ).json()
        topics = data.get("topics") or []
        total += sum(t["message_count"] for t in topics if t["topic_name"] == topic)
    return total


def _run_script(source: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``source`` in a fresh interpreter (importing this checkout's nsq_ha)."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


# -- a dropped producer is flushed at exit ----------------------------------------------------

_DROPPED = """
    import gc, sys, threading
    from nsq_ha import sync

    address, topic, count, keep = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    producer = sync.Producer(nsqd=address)
    queued = threading.Event()  # the loop waits until every publish is queued: exit finds them all
    sync.shared_loop().call_soon_threadsafe(queued.wait, 30)
    for i in range(count):
        producer.publish_async(topic, b"m%d" % i)
    if keep == "drop":
        del producer  # never closed, no longer referenced
        gc.collect()
    queued.set()
    print("queued", count)
"""


@pytest.mark.parametrize(
    ("keep", "host"), [("drop", "127.0.0.1"), ("keep", "127.0.0.1"), ("drop", "localhost")]
)
def test_a_producer_never_closed_is_flushed_at_exit(
    vanilla_cluster: VanillaCluster, keep: str, host: str
) -> None:
    """Dropped or not; by host name too (resolved at exit, when no new thread may start)."""
    topic = _topic()
    count = 20000
    address = f"{host}:{vanilla_cluster.nodes[0].tcp_port}"
    proc = _run_script(_DROPPED, address, topic, str(count), keep)
    assert f"queued {count}" in proc.stdout
    assert _stored(vanilla_cluster, topic) == count


_DROPPED_IN_THREAD = """
    import sys, threading
    from nsq_ha import sync

    address, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    queued = threading.Event()

    def work():  # the producer lives only in this thread's frame, which ends
        producer = sync.Producer(nsqd=address)
        sync.shared_loop().call_soon_threadsafe(queued.wait, 30)
        for i in range(count):
            producer.publish_async(topic, b"t%d" % i)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    queued.set()
"""


def test_a_producer_dropped_by_a_finished_thread_is_flushed_at_exit(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    _run_script(_DROPPED_IN_THREAD, vanilla_cluster.nodes[0].tcp_address, topic, "5000")
    assert _stored(vanilla_cluster, topic) == 5000


# -- a producer inherited by a forked child ---------------------------------------------------

_FORKED = """
    import os, sys, time
    from nsq_ha import sync

    address, topic = sys.argv[1], sys.argv[2]
    producer = sync.Producer(nsqd=address)
    producer.publish(topic, b"parent-before")  # the loop thread and a connection exist now
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            result = producer.publish(topic, b"child", timeout=10)
            producer.publish_many(topic, [b"child-a", b"child-b"], timeout=10)
            code = 0 if result.topic == topic else 4
            producer.close()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            sys.exit("the forked child did not finish within 20 s")
        time.sleep(0.05)
    print("child exit", os.waitstatus_to_exitcode(status))
    producer.publish(topic, b"parent-after")  # the parent's connections were left alone
    producer.close()
"""


def test_a_forked_child_can_publish_with_the_inherited_producer(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    proc = _run_script(_FORKED, vanilla_cluster.nodes[0].tcp_address, topic, timeout=60)
    assert "child exit 0" in proc.stdout, proc.stderr
    assert _stored(vanilla_cluster, topic) == 5


_FORKED_POOL = """
    import multiprocessing, sys
    from nsq_ha import sync

    address, topic = sys.argv[1], sys.argv[2]
    producer = sync.Producer(nsqd=address)
    producer.publish(topic, b"parent")

    def work(i):
        return producer.publish(topic, b"w%d" % i, timeout=10).topic

    with multiprocessing.get_context("fork").Pool(2) as pool:
        topics = pool.map_async(work, range(6)).get(timeout=30)
    assert topics == [topic] * 6, topics
    producer.close()
    print("pool ok")
"""


def test_a_fork_pool_publishes_with_a_producer_made_before_it(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    proc = _run_script(_FORKED_POOL, vanilla_cluster.nodes[0].tcp_address, topic, timeout=60)
    assert "pool ok" in proc.stdout
    assert _stored(vanilla_cluster, topic) == 7


_FORKED_PROCESS_EXIT = """
    import multiprocessing, sys, threading
    from nsq_ha import sync

    address, topic = sys.argv[1], sys.argv[2]
    producer = sync.Producer(nsqd=address)
    producer.publish(topic, b"parent")

    def work():  # returns with its publishes unfinished; multiprocessing then calls os._exit
        producer.publish_async(topic, b"c0")  # the child's own loop runs from here on
        queued = threading.Event()
        sync.shared_loop().call_soon_threadsafe(queued.wait, 30)
        for i in range(1, 3000):
            producer.publish_async(topic, b"c%d" % i)
        queued.set()

    child = multiprocessing.get_context("fork").Process(target=work)
    child.start()
    child.join(60)
    assert child.exitcode == 0, child.exitcode
    producer.close()
"""


def test_a_fork_child_process_flushes_the_inherited_producer_when_it_ends(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    _run_script(_FORKED_PROCESS_EXIT, vanilla_cluster.nodes[0].tcp_address, topic, timeout=90)
    assert _stored(vanilla_cluster, topic) == 3001


# -- bad durations refused before anything is sent --------------------------------------------

BAD_TIMEOUTS: list[object] = [math.inf, 1e12, "5", math.nan, -1.0, True, -math.inf]


def test_a_bad_publish_timeout_is_refused_before_sending(vanilla_cluster: VanillaCluster) -> None:
    topic = _topic()
    with sync.Producer(nsqd=vanilla_cluster.nodes[0].tcp_address) as producer:
        producer.publish(topic, b"first")
        for bad in BAD_TIMEOUTS:
            with pytest.raises(ConfigError, match="timeout"):
                producer.publish(topic, b"bad", timeout=bad)  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="timeout"):
                producer.publish_many(topic, [b"bad1", b"bad2"], timeout=bad)  # type: ignore[arg-type]
        producer.publish(topic, b"last")  # acknowledged after anything sent before it
        assert not producer.closed
    assert _stored(vanilla_cluster, topic) == 2


_FORKED_CONSUMER = """
    import os, sys, time
    from nsq_ha import sync
    from nsq_ha.errors import ConsumerClosedError, MessageConnectionGoneError

    address, topic = sys.argv[1], sys.argv[2]
    with sync.Producer(nsqd=address) as producer:
        producer.publish(topic, b"one")
    consumer = sync.Consumer(topic, "c", nsqd=address)
    message = consumer.get(timeout=10)
    assert message is not None
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            try:
                consumer.get(timeout=5)
            except ConsumerClosedError:
                code = 4
            try:
                message.finish()
            except MessageConnectionGoneError:
                code = 0 if code == 4 else 5
            consumer.close()  # nothing of this process to close: returns at once
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            sys.exit("the forked child did not finish within 20 s")
        time.sleep(0.05)
    print("child exit", os.waitstatus_to_exitcode(status))
    message.finish()  # the parent still answers its message
    consumer.close()
"""


def test_a_consumer_inherited_by_a_forked_child_refuses_at_once(
    vanilla_cluster: VanillaCluster,
) -> None:
    proc = _run_script(_FORKED_CONSUMER, vanilla_cluster.nodes[0].tcp_address, _topic(), timeout=60)
    assert "child exit 0" in proc.stdout, proc.stderr


def test_bad_consumer_durations_are_refused_and_change_nothing(
    vanilla_cluster: VanillaCluster,
) -> None:
    topic = _topic()
    address = vanilla_cluster.nodes[0].tcp_address
    with sync.Producer(nsqd=address) as producer:
        producer.publish(topic, b"before")
        with sync.Consumer(topic, "c", nsqd=address) as consumer:
            for bad in BAD_TIMEOUTS:
                with pytest.raises(ConfigError, match="timeout"):
                    consumer.get(timeout=bad)  # type: ignore[arg-type]
                with pytest.raises(ConfigError, match="drain_timeout"):
                    consumer.close(drain_timeout=bad)  # type: ignore[arg-type]
            message = consumer.get(timeout=10)  # still open, still delivering
            assert message is not None
            assert message.body == b"before"
            message.finish()
            producer.publish(topic, b"after")
            message = consumer.get(timeout=10)
            assert message is not None
            assert message.body == b"after"
            message.finish()
