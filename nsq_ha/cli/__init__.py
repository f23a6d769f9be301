"""The ``nsq-ha`` command line.

Client commands (``lookup``, ``topic create|list|delete``, ``pub``, ``tail``, ``stats``,
``channel ...``, ``leader move``) take ``--lookupd URL`` (repeatable; fork or vanilla
nsqlookupd) or ``--nsqd HOST:PORT`` (vanilla nsqd, repeatable), defaulting to
``$NSQ_HA_LOOKUPD`` / ``$NSQ_HA_NSQD``, and the TLS, AUTH and compression options
(:mod:`.where`).
``demo`` runs the main story on the embedded cluster, ``devcluster`` serves that cluster until
Ctrl-C, ``servers`` builds the real servers the tests use.

Failures print one line ``nsq-ha <command>: <what went wrong>`` on stderr and exit non-zero
(2: bad input, 1: it did not work, 130: interrupted); ``--debug`` adds logs and tracebacks.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from nsq_ha._version import __version__

from .deadline import add_timeout_option
from .parser import CliParser, add_topic_argument
from .where import add_where_options

__all__ = ["build_parser", "main"]

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``nsq-ha`` (every subcommand)."""
    from nsq_ha.admin import TopicSpec
    from nsq_ha.admin.lookupd import CREATE_TOPIC_TIMEOUT

    from . import admin_commands, stats
    from .arguments import field_default
    from .demo import DEMO_KEYS, DEMO_MESSAGES, DEMO_PRODUCERS
    from .pub import add_pub_options
    from .tail import add_tail_options

    parser = CliParser(prog="nsq-ha", description="The nsq_ha command line.")
    parser.add_argument("--version", action="version", version=f"nsq-ha {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log warnings (reconnects, retries, moves)"
    )
    parser.add_argument(
        "--debug", action="store_true", help="log everything the client does; show tracebacks"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    where = CliParser(add_help=False)
    group = add_where_options(where)
    group.add_argument("--plain", action="store_true", help="plain-text tables, no colours")

    lookup = sub.add_parser(
        "lookup",
        parents=[where],
        help="show a topic's partitions and their leaders",
        description="Show where a topic's partitions are (nsqlookupd /lookup).",
    )
    add_topic_argument(lookup)
    lookup.add_argument("--access", choices=["r", "w"], default="w", help="readers or writers (w)")
    lookup.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_timeout_option(lookup)

    topic = sub.add_parser("topic", help="topic administration (create: fork)")
    topic_sub = topic.add_subparsers(dest="topic_command", metavar="ACTION", required=True)
    create = topic_sub.add_parser(
        "create",
        parents=[where],
        help="create a topic and wait until it is writable",
        description="Create a topic through the leader nsqlookupd (/topic/create) and wait "
        "until every partition has a leader.",
    )
    add_topic_argument(create, what="the topic to create")
    partitions, replicas = (field_default(TopicSpec, name) for name in ("partitions", "replicas"))
    create.add_argument("--partitions", type=_positive, help=f"partition count ({partitions})")
    create.add_argument("--replicas", type=_positive, help=f"replicas per partition ({replicas})")
    create.add_argument("--ordered", action="store_true", help="an ordered topic (SUB_ORDERED)")
    create.add_argument("--ext", action="store_true", help="an ext topic (JSON headers, tags)")
    sync = create.add_mutually_exclusive_group()
    sync.add_argument(
        "--durable",
        action="store_true",
        help="fsync every write before nsqd acknowledges it (--sync-every 1): a leader crash "
        "loses no acknowledged message; costs publish throughput",
    )
    sync.add_argument(
        "--sync-every",
        type=_positive,
        metavar="N",
        help="the fork's syncdisk: fsync the partition log every N writes (1..4000; default: "
        "nsqd's --sync-every)",
    )
    create.add_argument(
        "--retention-days", type=_positive, metavar="DAYS", help="keep consumed data DAYS (1..60)"
    )
    create.add_argument(
        "--no-channel-auto-create",
        action="store_true",
        help="SUB to a channel that /channel/create did not make fails",
    )
    create.add_argument("--no-wait", action="store_true", help="return once lookupd accepted")
    add_timeout_option(
        create, CREATE_TOPIC_TIMEOUT, "the whole command", included="waiting until writable"
    )
    create.add_argument("--json", action="store_true", help="print the map as JSON")
    admin_commands.add_topic_parsers(topic_sub, where)

    pub = sub.add_parser("pub", parents=[where], help="publish each line of stdin or files")
    add_topic_argument(pub, what="the topic to publish to", files="files")
    add_pub_options(pub)

    tail = sub.add_parser(
        "tail",
        parents=[where],
        help="print messages of a topic (finishing them)",
        description="Consume a topic and print its messages, finishing each; on an ephemeral "
        "channel of its own (gone when tail exits) unless --channel names one.",
    )
    add_topic_argument(tail, what="the topic to print")
    add_tail_options(tail)

    admin_commands.add_parsers(sub, where)
    stats.add_parsers(sub, where)

    demo = sub.add_parser(
        "demo",
        help="the main story on the embedded cluster, verified",
        description=f"Start the embedded 3-node cluster, publish {DEMO_MESSAGES:,} keyed traced "
        "messages while a leader moves, consume them ordered and plain, verify order and no "
        "loss.",
    )
    demo.add_argument(
        "--messages", type=_positive, default=DEMO_MESSAGES, help=f"how many ({DEMO_MESSAGES})"
    )
    demo.add_argument(
        "--producers",
        type=_positive,
        default=DEMO_PRODUCERS,
        help=f"producer tasks ({DEMO_PRODUCERS})",
    )
    demo.add_argument(
        "--keys", type=_positive, default=DEMO_KEYS, help=f"distinct sharding keys ({DEMO_KEYS})"
    )
    demo.add_argument("--plain", action="store_true", help="plain-text tables, no colours")

    servers = sub.add_parser(
        "servers",
        help="build the real NSQ servers (vanilla, fork) into the cache",
        description="Build the real NSQ servers from the Go module proxy into the cache.",
    )
    servers.add_argument("names", nargs="*", help="recipes to build: vanilla, fork (all)")
    servers.add_argument("--keep-going", action="store_true", help="exit 0 even if one fails")
    bench = sub.add_parser(
        "bench",
        help="benchmark nsq_ha against pynsq, gnsq, ansq and the Go tools",
        description="Start vanilla nsqd (and the fork's cluster when built), install the peer "
        "clients into their own virtualenv, run every workload for each client in interleaved "
        "rounds and print medians, ratios and the targets as Markdown.",
    )
    size = bench.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_const",
        dest="profile",
        const="quick",
        help="3 rounds of smaller runs, under 5 minutes (the default)",
    )
    size.add_argument(
        "--full",
        action="store_const",
        dest="profile",
        const="full",
        help="5 rounds of 100k-message runs (the README's table)",
    )
    size.add_argument(
        "--smoke",
        action="store_const",
        dest="profile",
        const="smoke",
        help="tiny sizes, one round; fails if any run fails (make test)",
    )
    bench.set_defaults(profile="quick")
    bench.add_argument("--no-fork", action="store_true", help="vanilla nsqd only")
    bench.add_argument("--no-peers", action="store_true", help="nsq_ha and Go only")
    bench.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="WORKLOAD",
        help="run workloads whose id starts with this (repeatable)",
    )
    bench.add_argument("--json", type=Path, default=None, help="write the results here")
    bench.add_argument("--markdown", type=Path, default=None, help="write the tables here")
    bench.add_argument(
        "--cpu",
        action="store_true",
        help="instructions per message under valgrind's callgrind (two counts per client; "
        "with --smoke a tenth of them) instead of wall-clock rates",
    )
    dev = sub.add_parser(
        "devcluster",
        help="run the embedded fork cluster (lookupd + N nsqd) until Ctrl-C",
        description="Run the embedded fork cluster on loopback until interrupted; prints the "
        "lookupd address to give clients as --lookupd / lookupd=, and the export line that "
        "sets NSQ_HA_LOOKUPD for nsq-ha in another terminal.",
    )
    dev.add_argument("--nodes", type=_positive, default=3, help="number of nsqd (default 3)")
    dev.add_argument("--host", default="127.0.0.1", help="address to listen on")
    dev.add_argument(
        "--lookupd-port",
        type=_port,
        default=None,
        help="lookupd HTTP port (default: 4161, nsqlookupd's usual one, or a free one with a "
        "note when 4161 is taken; 0: a free one)",
    )
    dev.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS[:REPLICAS[:ordered][:ext]]]",
        help="create a topic at start (repeatable), e.g. orders:4:2:ordered",
    )
    dev.add_argument("--events", action="store_true", help="print the event log as it grows")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nsq-ha`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING if args.verbose else logging.ERROR,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command == "devcluster":
        try:
            from nsq_ha.devcluster.cli import run_devcluster
        except ModuleNotFoundError as exc:  # the devcluster extra is missing: exc names it
            print(f"nsq-ha devcluster: {_one_line(exc)}", file=sys.stderr, flush=True)
            return 1
        return run_devcluster(args)
    if args.command == "bench":
        from nsq_ha.bench import run_bench

        return run_bench(
            args.profile,
            fork=not args.no_fork,
            peers=not args.no_peers,
            only=args.only,
            json_path=args.json,
            markdown_path=args.markdown,
            strict=args.profile == "smoke",
            cpu=args.cpu,
        )
    if args.command == "servers":
        from nsq_ha.testing.build import main as build_main

        return build_main([*args.names, *(["--keep-going"] if args.keep_going else [])])
    command = _command(args)
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    name = getattr(args, "cli_name", None) or args.command + (
        f" {args.topic_command}" if args.command == "topic" else ""
    )
    return run(name, command, args)


def _command(args: argparse.Namespace) -> Command | None:
    from . import commands

    if getattr(args, "run", None) is not None:  # set by the subparsers of stats, channel, ...
        run_command: Command = args.run
        return run_command
    if args.command == "demo":
        from .demo import cmd_demo

        return cmd_demo
    table: dict[str, Command] = {
        "lookup": commands.cmd_lookup,
        "topic": commands.cmd_topic_create,
        "pub": commands.cmd_pub,
        "tail": commands.cmd_tail,
    }
    return table.get(args.command or "")


def run(name: str, command: Command, args: argparse.Namespace) -> int:
    """Run ``command``; turn every failure into one line on stderr and an exit code."""
    from nsq_ha.errors import ConfigError, NsqError

    from .commands import CliError

    def fail(message: str, code: int) -> int:
        print(f"nsq-ha {name}: {message}", file=sys.stderr, flush=True)
        return code

    try:
        return asyncio.run(command(args))
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except CliError as exc:
        return fail(str(exc), exc.code)
    except ConfigError as exc:
        if args.debug:
            logging.exception("bad input")
        return fail(_one_line(exc), 2)
    except NsqError as exc:
        if args.debug:
            logging.exception("failed")
        return fail(_one_line(exc), 1)
    except OSError as exc:
        if args.debug:
            logging.exception("failed")
        return fail(_one_line(exc), 1)
    except ModuleNotFoundError as exc:  # an extra is missing (demo: devcluster); exc says which
        if args.debug:
            logging.exception("failed")
        return fail(_one_line(exc), 1)
    except Exception as exc:  # a bug: still one line, the traceback with --debug
        if args.debug:
            logging.exception("internal error")
        return fail(
            f"internal error {type(exc).__name__}: {_one_line(exc)} (--debug shows more)", 1
        )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


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
