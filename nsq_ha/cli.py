"""The ``nsq-ha`` command line.

For now it has ``--version`` and ``servers`` (build the real NSQ servers used by the tests);
the client commands (lookup, pub, tail, topic, devcluster, demo) arrive with the CLI issue.
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
    args = parser.parse_args(argv)
    if args.command == "servers":
        from nsq_ha.testing.build import main as build_main

        return build_main([*args.names, *(["--keep-going"] if args.keep_going else [])])
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
