"""The ``nsq-ha`` command line.

For now it has ``--version``, ``servers`` (build the real NSQ servers used by the tests) and
``devcluster`` (run the embedded fork cluster until Ctrl-C); the client commands (lookup, pub,
tail, topic, demo) arrive with the CLI issue.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from nsq_ha._version import __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nsq-ha`` console script; returns the exit code."""
    parser = argparse.ArgumentParser(prog="nsq-ha", description="The nsq_ha command line.")
    parser.add_argument("--version", action="version", version=f"nsq-ha {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    servers = sub.add_parser(
        "servers",
        help="build the real NSQ servers (vanilla, fork) into the cache",
        description="Build the real NSQ servers from the Go module proxy into the cache.",
    )
    servers.add_argument("names", nargs="*", help="recipes to build: vanilla, fork (all)")
    servers.add_argument("--keep-going", action="store_true", help="exit 0 even if one fails")
    dev = sub.add_parser(
        "devcluster",
        help="run the embedded fork cluster (lookupd + N nsqd) until Ctrl-C",
        description="Run the embedded fork cluster on loopback until interrupted; prints the "
        "lookupd address to give clients as --lookupd / lookupd=.",
    )
    dev.add_argument("--nodes", type=_positive, default=3, help="number of nsqd (default 3)")
    dev.add_argument("--host", default="127.0.0.1", help="address to listen on")
    dev.add_argument(
        "--lookupd-port", type=_port, default=0, help="lookupd HTTP port (default: a free one)"
    )
    dev.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS[:REPLICAS[:ordered][:ext]]]",
        help="create a topic at start (repeatable), e.g. orders:4:2:ordered",
    )
    dev.add_argument("--events", action="store_true", help="print the event log as it grows")
    args = parser.parse_args(argv)
    if args.command == "devcluster":
        from nsq_ha.devcluster.cli import run_devcluster

        return run_devcluster(args)
    if args.command == "servers":
        from nsq_ha.testing.build import main as build_main

        return build_main([*args.names, *(["--keep-going"] if args.keep_going else [])])
    parser.print_help(sys.stderr)
    return 2


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
