"""The parser class of every ``nsq-ha`` command, and the topic argument the commands share.

:class:`CliParser` is :class:`argparse.ArgumentParser` with two additions, both in argparse's
own terms (usage, one ``error:`` line, exit 2):

* a mistyped option or command gets a guess: ``unrecognized arguments: --partitons 4 (did you
  mean --partitions?)`` and ``invalid choice: 'lokup' (...; did you mean 'lookup'?)``, from the
  options of the command that was being parsed (:mod:`difflib`);
* :func:`add_topic_argument` gives a command ``--topic T`` and the first positional argument
  ``TOPIC`` (``nsq-ha lookup orders``), in any order with its options; both given and different
  is an error, and so is neither where the topic is required. ``args.topic`` holds the topic.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["CliParser", "add_topic_argument"]

_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
#: where the positional topic is kept until it is merged into ``topic``
_POSITIONAL = "topic_positional"
#: the namespace attribute naming the innermost parser that parsed (a subcommand's)
_PARSED_BY = "_cli_parser"


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors guess what a mistyped option or command meant, and whose
    subcommands may take their topic as a positional argument (:func:`add_topic_argument`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the arguments this parser was given last (for the guesses of :meth:`error`)
        self.seen: list[str] = []
        #: ``None``: no positional topic; else whether a topic is required
        self.topic_required: bool | None = None
        #: the dest of the ``FILE...`` positional after TOPIC, if the command has one
        self.topic_files: str | None = None
        self._busy = False

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's; arguments left over are refused by the subcommand that was parsed,
        with its usage and a guess."""
        parsed, extras = self.parse_known_args(args, namespace)
        by: CliParser = getattr(parsed, _PARSED_BY, self)
        if hasattr(parsed, _PARSED_BY):
            delattr(parsed, _PARSED_BY)
        if extras:
            by.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._busy:  # argparse's intermixed parsing calls back
            return super().parse_known_args(args, namespace)
        self.seen = list(sys.argv[1:] if args is None else args)
        self._busy = True
        try:
            if self.topic_required is None:
                parsed, extras = super().parse_known_args(args, namespace)
            else:  # TOPIC may come after options: `nsq-ha channel seek --channel c orders 0`
                parsed, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._busy = False
        if self.topic_required is not None:
            if extras:  # first: an unknown option's value may have been taken for TOPIC
                self.error(f"unrecognized arguments: {' '.join(extras)}")
            self._merge_topic(parsed)
        if not hasattr(parsed, _PARSED_BY):  # the innermost parser comes back first
            setattr(parsed, _PARSED_BY, self)
        return parsed, extras

    def _merge_topic(self, parsed: argparse.Namespace) -> None:
        positional = getattr(parsed, _POSITIONAL, None)
        if hasattr(parsed, _POSITIONAL):
            delattr(parsed, _POSITIONAL)
        flag = getattr(parsed, "topic", None)
        if positional is not None and flag is not None and self.topic_files is not None:
            # `pub --topic t a.txt`: with --topic, every positional is a FILE
            setattr(parsed, self.topic_files, [positional, *getattr(parsed, self.topic_files)])
            positional = None
        if positional is not None and flag is not None and positional != flag:
            self.error(f"the topic is given twice, as TOPIC {positional!r} and --topic {flag!r}")
        parsed.topic = flag if flag is not None else positional
        if parsed.topic is None and self.topic_required:
            self.error("the following arguments are required: TOPIC (or --topic T)")

    def error(self, message: str) -> NoReturn:
        """argparse's error (usage, one line, exit 2), with a guess when one is close."""
        super().error(message + self._guess(message))

    def _guess(self, message: str) -> str:
        choice = _INVALID_CHOICE.search(message)
        if choice is not None:
            choices = re.findall(r"'([^']*)'", choice.group(2))
            near = difflib.get_close_matches(choice.group(1), choices, n=1)
            return f"; did you mean {near[0]!r}?" if near else ""
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        guesses: dict[str, str] = {}
        for word in self.seen:
            name = word.split("=", 1)[0]
            if not name.startswith("--") or len(name) < 3:
                continue
            if any(option.startswith(name) for option in known):  # known, or abbreviated
                continue
            for close in difflib.get_close_matches(name, known, n=1):
                guesses.setdefault(name, close)
        if not guesses:
            return ""
        if message.startswith("unrecognized arguments"):
            return f" (did you mean {', '.join(guesses.values())}?)"
        return "".join(f" ({typed}: did you mean {meant}?)" for typed, meant in guesses.items())


def add_topic_argument(
    parser: argparse.ArgumentParser,
    *,
    required: bool = True,
    what: str = "the topic",
    files: str | None = None,
) -> None:
    """``--topic T`` and the positional ``TOPIC`` (first of the command's positionals, any
    place among its options) on ``parser``, a :class:`CliParser` (every ``nsq-ha``
    subcommand's parser is one); ``what`` is its help text. Parsing sets ``args.topic``
    (None when not ``required`` and not given); TOPIC and --topic both given and different,
    or neither when ``required``, is a usage error (exit 2). ``files`` names the dest of a
    ``FILE...`` positional the command adds after this one (``nsq-ha pub TOPIC [FILE...]``):
    when ``--topic`` is given, every positional is a FILE."""
    if not isinstance(parser, CliParser):
        raise TypeError(f"add_topic_argument needs a CliParser, got {type(parser).__name__}")
    parser.add_argument(_POSITIONAL, nargs="?", metavar="TOPIC", help=f"{what} (or --topic T)")
    parser.add_argument("--topic", metavar="T", help=f"{what}, as an option")
    parser.topic_required = required
    parser.topic_files = files
