"""The ``nsq-ha`` parser: a mistyped option or command gets a did-you-mean (exit 2, as
argparse's own errors), and every admin command takes its topic as ``--topic T`` or as the first
positional argument (no server)."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

import pytest

from nsq_ha.admin import LookupdAdmin, TopicSpec
from nsq_ha.admin.lookupd import CREATE_TOPIC_TIMEOUT
from nsq_ha.cli import build_parser, main
from nsq_ha.cli.demo import run_demo


@pytest.fixture(autouse=True)
def _no_address_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NSQ_HA_LOOKUPD", "NSQ_HA_NSQD"):
        monkeypatch.delenv(name, raising=False)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The stderr of ``nsq-ha ARGV``, which must exit 2 from the parser."""
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# -- did you mean ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "unknown", "meant"),
    [
        (["topic", "create", "--topic", "t", "--partitons", "4"], "--partitons", "--partitions"),
        (["topic", "create", "t", "--replicsa", "2"], "--replicsa", "--replicas"),
        (["lookup", "--topic", "t", "--jsn"], "--jsn", "--json"),
        (["stats", "--wach", "1"], "--wach", "--watch"),
        (["leader", "move", "--topic", "t", "--partition", "0", "--too", "n"], "--too", "--to"),
        (["topic", "create", "--topic", "t", "--partitons=4"], "--partitons=4", "--partitions"),
        (["servers", "--keep-gong"], "--keep-gong", "--keep-going"),
    ],
)
def test_a_mistyped_option_gets_a_did_you_mean(
    argv: list[str], unknown: str, meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(argv, capsys)
    assert f"unrecognized arguments: {unknown}" in err
    assert f"did you mean {meant}?" in err
    assert f"usage: nsq-ha {argv[0]}" in err  # the usage of the command that was mistyped


def test_a_mistyped_required_option_is_named_with_its_guess(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(["channel", "seek", "--topic", "t", "--chanel", "c", "earliest"], capsys)
    assert "the following arguments are required: --channel" in err
    assert "(--chanel: did you mean --channel?)" in err


def test_an_option_like_no_other_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["lookup", "--topic", "t", "--zzzzzz"], capsys)
    assert "unrecognized arguments: --zzzzzz" in err
    assert "did you mean" not in err


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["lokup", "--topic", "t"], "lookup"),
        (["stat"], "stats"),
        (["topic", "craete", "--topic", "t"], "create"),
        (["channel", "seak", "--topic", "t", "--channel", "c", "earliest"], "seek"),
    ],
)
def test_a_mistyped_command_gets_a_did_you_mean(
    argv: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(argv, capsys)
    assert "invalid choice" in err
    assert f"did you mean {meant!r}?" in err


# -- the topic as --topic T or TOPIC -------------------------------------------------------------

L = ("--lookupd", "http://l:4161")


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["lookup", "orders", *L], {}),
        (["lookup", *L, "orders", "--json"], {"json": True}),
        (["stats", "orders", "--watch", "1"], {"watch": 1.0}),
        (["topic", "create", "orders", "--partitions", "4", "--ordered"], {"partitions": 4}),
        (["topic", "delete", "orders"], {}),
        (["channel", "pause", "orders", "--channel", "c"], {"channel": "c"}),
        (
            ["channel", "seek", "orders", "--channel", "c", "timestamp=1"],
            {"position": "timestamp=1"},
        ),
        (["channel", "seek", "--channel", "c", "orders", "earliest"], {"position": "earliest"}),
        (["channel", "seek", "--channel", "c", "orders", "count=2", "--partition", "1"], {}),
        (["channel", "setorder", "orders", "--channel", "c", "on"], {"order": "on"}),
        (["leader", "move", "orders", "--partition", "0"], {"partition": 0}),
        (["lookup", "orders", "--topic", "orders"], {}),  # both, the same
    ],
)
def test_the_topic_may_be_the_first_positional_argument(
    argv: list[str], wanted: dict[str, object]
) -> None:
    args = parse(*argv)
    assert args.topic == "orders"
    for name, value in wanted.items():
        assert getattr(args, name) == value, name
    assert not hasattr(args, "topic_positional")


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (
            [
                "channel",
                "seek",
                "--topic",
                "orders",
                "--channel",
                "b",
                "timestamp=2026-11-24T09:00",
            ],
            {"position": "timestamp=2026-11-24T09:00"},
        ),
        (["channel", "setorder", "--topic", "orders", "--channel", "c", "off"], {"order": "off"}),
        (["lookup", "--topic", "orders", "--access", "r"], {"access": "r"}),
        (["topic", "create", "--topic", "orders", "--replicas", "2"], {"replicas": 2}),
    ],
)
def test_topic_as_an_option_still_works(argv: list[str], wanted: dict[str, object]) -> None:
    args = parse(*argv)
    assert args.topic == "orders"
    for name, value in wanted.items():
        assert getattr(args, name) == value, name


def test_stats_without_a_topic_is_every_topic() -> None:
    assert parse("stats", *L).topic is None


@pytest.mark.parametrize(
    "argv",
    [
        ["lookup", "orders", "--topic", "audit"],
        ["channel", "seek", "orders", "--topic", "audit", "--channel", "c", "earliest"],
    ],
)
def test_two_different_topics_are_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(argv, capsys)
    assert "the topic is given twice, as TOPIC 'orders' and --topic 'audit'" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["lookup", *L],
        ["topic", "create", "--partitions", "2"],
        ["topic", "delete"],
        ["channel", "pause", "--channel", "c"],
        ["channel", "seek", "--channel", "c", "earliest"],
        ["leader", "move", "--partition", "0"],
    ],
)
def test_no_topic_is_refused_where_one_is_needed(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(argv, capsys)
    assert "the following arguments are required: TOPIC (or --topic T)" in err


# -- defaults are the library's ------------------------------------------------------------------


def _default(function: Any, name: str) -> Any:
    return inspect.signature(function).parameters[name].default


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_topic_create_leaves_partitions_and_replicas_to_topic_spec(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = parse("topic", "create", "t")
    assert (args.partitions, args.replicas) == (None, None)
    assert args.timeout == _default(LookupdAdmin.create_topic, "timeout")
    spec = TopicSpec("t")
    text = _help(["topic", "create"], capsys)
    assert f"partition count ({spec.partitions})" in text
    assert f"replicas per partition ({spec.replicas})" in text
    assert f"waiting until writable included ({CREATE_TOPIC_TIMEOUT:g})" in text


def test_demo_defaults_are_run_demos(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("demo")
    for name in ("messages", "producers", "keys"):
        assert getattr(args, name) == _default(run_demo, name)
    text = _help(["demo"], capsys)
    assert f"how many ({_default(run_demo, 'messages')})" in text
    assert f"producer tasks ({_default(run_demo, 'producers')})" in text
    assert f"distinct sharding keys ({_default(run_demo, 'keys')})" in text
