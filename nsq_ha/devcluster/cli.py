"""``nsq-ha devcluster``: run the embedded cluster in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import signal
import sys
import time

from .cluster import DevCluster
from .model import Event, ServerError

__all__ = ["USUAL_LOOKUPD_PORT", "parse_topic", "run_devcluster"]

#: nsqlookupd's usual HTTP port: the README's examples use it, so the cluster takes it by default
USUAL_LOOKUPD_PORT = 4161


class PortTakenError(OSError):
    """The ``--lookupd-port`` given is in use."""


def parse_topic(spec: str) -> tuple[str, int, int, bool, bool]:
    """``NAME[:PARTITIONS[:REPLICAS[:ordered][:ext]]]`` -> (name, partitions, replicas,
    ordered, ext); ValueError with a readable message when malformed."""
    name, *rest = spec.split(":")
    numbers = [p for p in rest if p.isdigit()]
    flags = [p for p in rest if not p.isdigit()]
    unknown = set(flags) - {"ordered", "ext"}
    if not name or len(numbers) > 2 or unknown:
        raise ValueError(f"bad --topic {spec!r}: want NAME[:PARTITIONS[:REPLICAS[:ordered][:ext]]]")
    partitions = int(numbers[0]) if numbers else 1
    replicas = int(numbers[1]) if len(numbers) > 1 else 1
    return name, partitions, replicas, "ordered" in flags, "ext" in flags


async def _start(args: argparse.Namespace) -> DevCluster:
    """The cluster on ``--lookupd-port``, or on 4161, or (4161 taken) on a free port."""
    port = USUAL_LOOKUPD_PORT if args.lookupd_port is None else args.lookupd_port
    cluster = DevCluster(nodes=args.nodes, host=args.host, lookupd_port=port)
    try:
        await cluster.start()
    except OSError as exc:
        await cluster.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        if args.lookupd_port is not None:
            raise PortTakenError(
                f"port {port} on {args.host} is in use: give another --lookupd-port "
                "(0 takes a free one)"
            ) from None
        print(
            f"nsq-ha devcluster: note: port {port} is taken (another nsqlookupd or devcluster?), "
            "so lookupd listens on a free port: use the export line below",
            file=sys.stderr,
            flush=True,
        )
        cluster = DevCluster(nodes=args.nodes, host=args.host, lookupd_port=0)
        await cluster.start()
    return cluster


async def _serve(args: argparse.Namespace, started: float) -> int:
    topics = [parse_topic(spec) for spec in args.topic]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    cluster = await _start(args)
    try:
        for name, partitions, replicas, ordered, ext in topics:
            cluster.create_topic(name, partitions, replicas, ordered=ordered, ext=ext)
        elapsed = time.monotonic() - started
        print(f"lookupd {cluster.lookupd_http}", flush=True)
        for node in cluster.nodes:
            print(f"nsqd{node.index} tcp {node.tcp_address} http {node.http_url}", flush=True)
        for topic in cluster.topics.values():
            leaders = ",".join(str(p.leader.index) for p in topic.partitions)
            print(f"topic {topic.name} partitions {topic.partition_num} leaders {leaders}")
        print(f"export NSQ_HA_LOOKUPD={cluster.lookupd_http}", flush=True)
        print(f"ready in {elapsed:.3f}s (Ctrl-C stops)", flush=True)
        if args.events:

            def show(event: Event) -> None:
                print(event, flush=True)

            cluster.on_event(show)
        await stop.wait()
    finally:
        await cluster.close()
    print("stopped", flush=True)
    return 0


def run_devcluster(args: argparse.Namespace) -> int:
    """Entry point of the ``devcluster`` subcommand; returns the exit code."""
    started = time.monotonic()
    try:
        return asyncio.run(_serve(args, started))
    except ValueError as exc:
        print(f"nsq-ha devcluster: {exc}", file=sys.stderr)
        return 2
    except PortTakenError as exc:
        print(f"nsq-ha devcluster: cannot listen: {exc}", file=sys.stderr)
        return 1
    except ServerError as exc:
        print(f"nsq-ha devcluster: cannot create topic: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"nsq-ha devcluster: cannot listen: {exc}", file=sys.stderr)
        return 1
