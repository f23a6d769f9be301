"""``nsq-ha stats``, ``topic list|delete``, ``channel ...`` and ``leader move``: argument
parsing, positions, addresses, and how ``/stats`` entries become rows (no server)."""

from __future__ import annotations

import argparse
import inspect
import io
from datetime import UTC, datetime
from typing import Any

import pytest

from nsq_ha.admin import LookupdAdmin
from nsq_ha.cli import build_parser, main
from nsq_ha.cli.admin_commands import (
    addresses,
    cmd_channel,
    cmd_leader_move,
    cmd_topic_delete,
    cmd_topic_list,
    parse_position,
)
from nsq_ha.cli.commands import CliError
from nsq_ha.cli.deadline import DEFAULT_TIMEOUT
from nsq_ha.cli.output import print_table
from nsq_ha.cli.stats import COLUMNS, StatsRow, cmd_stats, collect, rows_from_stats, table_rows


@pytest.fixture(autouse=True)
def _no_address_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NSQ_HA_LOOKUPD", "NSQ_HA_NSQD"):
        monkeypatch.delenv(name, raising=False)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


# -- positions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "body"),
    [
        ("earliest", "virtual_queue:0"),
        ("latest", "special:-1"),
        ("LATEST", "special:-1"),
        ("offset=0", "virtual_queue:0"),
        ("offset=4096", "virtual_queue:4096"),
        ("count=1", "msgcount:1"),
        ("count=3", "msgcount:3"),
        ("timestamp=1700000000", "timestamp:1700000000"),
        ("timestamp=1700000000.9", "timestamp:1700000000"),
        ("timestamp=0", "timestamp:0"),
    ],
)
def test_positions_become_setoffset_bodies(text: str, body: str) -> None:
    assert parse_position(text) == body


def test_an_iso_timestamp_is_read_as_that_moment() -> None:
    moment = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_position("timestamp=2024-01-02T03:04:05+00:00") == (
        f"timestamp:{int(moment.timestamp())}"
    )


@pytest.mark.parametrize(
    "text",
    [
        "sideways",
        "",
        "earliest=3",
        "offset=",
        "offset=-1",
        "offset=abc",
        "count=0",
        "count=1.5",
        "timestamp=nan",
        "timestamp=yesterday",
        "timestamp=-5",
    ],
)
def test_bad_positions_are_input_errors(text: str) -> None:
    with pytest.raises(CliError) as caught:
        parse_position(text)
    assert caught.value.code == 2
    assert repr(text) in str(caught.value)


# -- parsing and dispatch ----------------------------------------------------------------------


def test_each_new_command_names_its_handler_and_its_error_prefix() -> None:
    where = ["--lookupd", "http://l:4161"]
    cases = [
        (["stats", *where], cmd_stats, "stats"),
        (["topic", "list", *where], cmd_topic_list, "topic list"),
        (["topic", "delete", *where, "--topic", "t"], cmd_topic_delete, "topic delete"),
        (["leader", "move", *where, "--topic", "t", "--partition", "1"], cmd_leader_move, None),
    ]
    for action in ("create", "delete", "pause", "unpause", "empty"):
        argv = ["channel", action, *where, "--topic", "t", "--channel", "c"]
        cases.append((argv, cmd_channel, f"channel {action}"))
    for argv, handler, name in cases:
        args = parse(*argv)
        assert args.run is handler, argv
        assert args.cli_name == (name or "leader move")


def test_topic_create_still_dispatches_by_the_table() -> None:
    args = parse("topic", "create", "--lookupd", "http://l:4161", "--topic", "t")
    assert getattr(args, "run", None) is None
    assert args.topic_command == "create"


def test_seek_setorder_and_create_arguments() -> None:
    base = ["--lookupd", "http://l:4161", "--topic", "t", "--channel", "c"]
    seek = parse("channel", "seek", *base, "count=3", "--partition", "0", "--partition", "2")
    assert (seek.position, seek.partition) == ("count=3", [0, 2])
    assert parse("channel", "setorder", *base, "off").order == "off"
    assert parse("channel", "create", *base).start == "end"
    assert parse("channel", "create", *base, "--from", "start").start == "start"


@pytest.mark.parametrize(
    "argv",
    [
        ["channel", "setorder", "--topic", "t", "--channel", "c", "maybe"],
        ["channel", "seek", "--topic", "t", "--channel", "c"],
        ["channel", "pause", "--topic", "t"],
        ["channel", "rename", "--topic", "t", "--channel", "c"],
        ["leader", "move", "--topic", "t"],
        ["stats", "--watch", "0"],
        ["stats", "--watch", "soon"],
    ],
)
def test_argparse_refuses_malformed_commands(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(*argv)
    assert caught.value.code == 2
    assert "usage: nsq-ha" in capsys.readouterr().err


def test_watch_defaults_to_two_seconds() -> None:
    assert parse("stats", "--lookupd", "http://l").watch is None
    assert parse("stats", "--lookupd", "http://l", "--watch").watch == 2.0
    args = parse("stats", "--lookupd", "http://l", "--watch", "0.5", "--count", "3", "--json")
    assert (args.watch, args.count, args.json) == (0.5, 3, True)


@pytest.mark.parametrize(
    ("argv", "default"),
    [
        (["topic", "create", "--topic", "t"], 120.0),
        (["leader", "move", "--topic", "t", "--partition", "0"], 240.0),
        (["topic", "list"], 30.0),
        (["topic", "delete", "--topic", "t"], 30.0),
        (["channel", "empty", "--topic", "t", "--channel", "c"], 30.0),
        (["stats"], 30.0),
        (["lookup", "--topic", "t"], 30.0),
    ],
)
def test_every_admin_command_has_a_deadline_that_follows_the_duration_rule(
    argv: list[str], default: float, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse(*argv).timeout == default
    assert parse(*argv, "--timeout", "0.5").timeout == 0.5
    for bad in ("nan", "inf", "-1", "0", "soon"):
        with pytest.raises(SystemExit) as caught:
            parse(*argv, "--timeout", bad)
        assert caught.value.code == 2
        assert "argument --timeout" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["nan", "inf", "1e400"])
def test_watch_refuses_what_is_not_a_finite_interval(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse("stats", "--watch", bad)
    assert caught.value.code == 2
    assert "finite number of seconds" in capsys.readouterr().err


# -- addresses -------------------------------------------------------------------------------


def _ns(**kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = {"lookupd": [], "nsqd": [], "nsqd_http": []}
    return argparse.Namespace(**{**base, **kw})


def test_addresses_take_lookupd_or_nsqd_http() -> None:
    assert addresses(_ns(lookupd=["http://a:4161"])).lookupd == ["http://a:4161"]
    got = addresses(_ns(nsqd_http=["127.0.0.1:4151", "https://n:4152/"]))
    assert got.nsqd_http == ["http://127.0.0.1:4151", "https://n:4152"]
    assert got.lookupd == []


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"lookupd": ["http://a"], "nsqd_http": ["n:1"]}, "not both"),
        ({"nsqd": ["127.0.0.1:4150"]}, "instead of --nsqd"),
        ({}, "give --lookupd URL"),
    ],
)
def test_missing_or_conflicting_addresses_are_input_errors(
    kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(CliError, match=message) as caught:
        addresses(_ns(**kw))
    assert caught.value.code == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["channel", "seek", "--topic", "t", "--channel", "c", "up"], "bad position 'up'"),
        (
            ["leader", "move", "--nsqd", "127.0.0.1:4150", "--topic", "t", "--partition", "0"],
            "HTTP",
        ),
        (["stats", "--lookupd", "http://127.0.0.1:1", "--count", "2"], "--count needs --watch"),
        (["topic", "delete", "--lookupd", "http://127.0.0.1:1", "--topic", "bad topic!"], "topic"),
        (
            [
                "channel",
                "pause",
                "--lookupd",
                "http://127.0.0.1:1",
                "--topic",
                "t",
                "--channel",
                "b c",
            ],
            "channel",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_request(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if "--lookupd" not in argv and "--nsqd" not in argv:
        argv = [*argv, "--lookupd", "http://127.0.0.1:1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"nsq-ha {argv[0]}")
    assert message in err[0]


def test_an_unreachable_lookupd_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--lookupd", "http://127.0.0.1:1"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("nsq-ha stats: ")
    assert "unreachable" in line


# -- rows ------------------------------------------------------------------------------------

FORK_ENTRY: dict[str, Any] = {
    "topic_name": "orders",
    "topic_partition": "1",
    "is_leader": True,
    "message_count": 2,
    "depth": 72,
    "channels": [
        {
            "channel_name": "billing",
            "depth": 2,
            "depth_size": 72,
            "in_flight_count": 1,
            "deferred_count": 0,
            "requeue_count": 4,
            "timeout_count": 1,
            "client_num": 1,
            "clients": None,
            "paused": True,
        }
    ],
}

VANILLA_ENTRY: dict[str, Any] = {
    "topic_name": "orders",
    "message_count": 10,
    "channels": [
        {
            "channel_name": "b",
            "depth": 3,
            "in_flight_count": 2,
            "deferred_count": 1,
            "requeue_count": 0,
            "timeout_count": 0,
            "client_count": 2,
            "paused": False,
        },
        {"channel_name": "a", "depth": 0, "in_flight_count": 0, "deferred_count": 0},
    ],
}


def test_fork_lag_is_the_unconfirmed_depth_and_bytes() -> None:
    (row,) = rows_from_stats(FORK_ENTRY, "10.0.0.2:4150")
    assert row == StatsRow(
        topic="orders",
        partition=1,
        leader="10.0.0.2:4150",
        channel="billing",
        messages=2,
        depth=2,
        in_flight=1,
        deferred=0,
        requeued=4,
        timeouts=1,
        consumers=1,
        paused=True,
        lag_messages=2,
        lag_bytes=72,
    )


def test_vanilla_lag_counts_unfinished_messages_and_bytes_are_unknown() -> None:
    a, b = rows_from_stats(VANILLA_ENTRY, "n1:4150")
    assert (a.channel, b.channel) == ("a", "b")  # sorted
    assert (b.partition, b.lag_messages, b.lag_bytes, b.consumers) == (None, 6, None, 2)
    assert (a.lag_messages, a.consumers) == (0, None)


def test_a_topic_without_channels_is_one_row() -> None:
    (row,) = rows_from_stats({"topic_name": "t", "topic_partition": "0", "channels": []}, "n")
    assert (row.channel, row.partition, row.lag_messages) == (None, 0, None)


def test_table_cells_mark_paused_unknown_and_channel_less_rows() -> None:
    rows = [
        *rows_from_stats(FORK_ENTRY, "f:1"),
        *rows_from_stats(VANILLA_ENTRY, "v:1"),
        StatsRow("empty", 0, "f:1", None, 0),
    ]
    cells = table_rows(rows)
    assert cells[0] == ["orders", 1, "f:1", "billing (paused)", 2, 1, 0, 4, 1, 1, 2, 72]
    assert cells[2][:4] == ["orders", "-", "v:1", "b"]
    assert cells[2][-2:] == [6, "?"]
    assert cells[3][:4] == ["empty", 0, "f:1", "(no channel)"]
    assert all(len(c) == len(COLUMNS) for c in cells)
    out = io.StringIO()
    print_table("stats", COLUMNS, cells, stream=out, plain=True)
    lines = out.getvalue().splitlines()
    assert lines[1].split()[:4] == ["topic", "partition", "leader", "channel"]
    assert lines[3].split() == [
        "orders",
        "1",
        "f:1",
        "billing",
        "(paused)",
        "2",
        "1",
        "0",
        "4",
        "1",
        "1",
        "2",
        "72",
    ]


# -- defaults are the library's ----------------------------------------------------------------


def _default(function: Any, name: str) -> Any:
    return inspect.signature(function).parameters[name].default


@pytest.mark.parametrize(
    ("argv", "call"),
    [
        (["topic", "create", "t"], LookupdAdmin.create_topic),
        (["topic", "expand", "t", "--partitions", "2"], LookupdAdmin.expand_topic),
        (["leader", "move", "t", "--partition", "0"], LookupdAdmin.move_leader),
    ],
)
def test_a_waiting_command_defaults_to_its_library_calls_timeout(
    argv: list[str], call: Any
) -> None:
    assert parse(*argv).timeout == _default(call, "timeout")


def test_every_refresh_of_stats_has_the_commands_deadline() -> None:
    assert _default(collect, "limit") == DEFAULT_TIMEOUT == parse("stats").timeout


def test_nsqd_http_is_the_same_option_everywhere() -> None:
    def option(*argv: str) -> tuple[object, ...]:
        parser = build_parser()
        for word in argv:  # down to the subcommand's own parser
            (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = sub.choices[word]
        (found,) = (a for a in parser._actions if "--nsqd-http" in a.option_strings)
        return (found.dest, found.default, found.metavar, found.help, type(found))

    assert option("stats") == option("topic", "list") == option("leader", "move")
    assert parse("stats", "--nsqd-http", "n:4151").nsqd_http == ["n:4151"]
