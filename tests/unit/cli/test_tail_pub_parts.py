"""The pure parts of ``nsq-ha tail`` and ``nsq-ha pub``: ``--from``, ``--format``, ``--rate``,
``--delimiter``, ``--defer``, the token bucket (a fake clock: no wall-clock thresholds); record
reading is in ``test_cli_pub_records.py``."""

from __future__ import annotations

import dataclasses

import pytest

from nsq_ha.cli import build_parser
from nsq_ha.cli.pub import TokenBucket, parse_delimiter, parse_rate
from nsq_ha.cli.tail import (
    FIELDS,
    Start,
    check_template,
    max_in_flight,
    parse_start,
    wants_offsets,
)
from nsq_ha.cli.where import CliError
from nsq_ha.consumer import ConsumerConfig
from nsq_ha.lookup.wire import PartitionMap
from nsq_ha.routing import DEFAULT_STRATEGY, STRATEGIES


@pytest.mark.parametrize(
    ("text", "start", "position"),
    [
        ("earliest", Start("earliest"), "virtual_queue:0"),
        ("start", Start("earliest"), "virtual_queue:0"),
        ("latest", Start("latest"), "special:-1"),
        ("END", Start("latest"), "special:-1"),
        ("offset=124", Start("offset", 124), "virtual_queue:124"),
        ("timestamp=1700000000", Start("timestamp", 1700000000.0), "timestamp:1700000000"),
        (
            "timestamp=2023-11-14T22:13:20+00:00",
            Start("timestamp", 1700000000.0),
            "timestamp:1700000000",
        ),
        ("timestamp=2023-11-14T22:13:20", Start("timestamp", 1700000000.0), "timestamp:1700000000"),
    ],
)
def test_from_positions(text: str, start: Start, position: str) -> None:
    parsed = parse_start(text)
    assert parsed == start
    assert parsed.position() == position


@pytest.mark.parametrize(
    "text", ["beginning", "offset=-1", "offset=x", "offset=", "timestamp=soon", "count=3", ""]
)
def test_bad_from_positions_are_exit_2(text: str) -> None:
    with pytest.raises(CliError) as info:
        parse_start(text)
    assert info.value.code == 2
    assert "\n" not in str(info.value)


def test_no_from_is_none() -> None:
    assert parse_start(None) is None


@pytest.mark.parametrize(
    "template",
    [
        "{partition}@{offset} {body}",
        "{body!r:>20}",
        "{{literal}} {id}",
        " ".join(f"{{{f}}}" for f in FIELDS),
    ],
)
def test_good_templates(template: str) -> None:
    check_template(template)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{nope}", "unknown field {nope}"),
        ("{body.upper}", "unknown field {body.upper}"),
        ("{body[0]}", "unknown field {body[0]}"),
        ("{}", "name each field"),
        ("{0}", "name each field"),
        ("{body", "--format"),
        ("{body:%Y}", "--format"),
    ],
)
def test_bad_templates_are_exit_2(template: str, message: str) -> None:
    with pytest.raises(CliError, match=message.replace("{", r"\{").replace("[", r"\[")) as info:
        check_template(template)
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("text", "per_second"),
    [("50", 50.0), ("50/s", 50.0), ("120/min", 2.0), ("7200/h", 2.0), ("0.5/s", 0.5)],
)
def test_rates(text: str, per_second: float) -> None:
    assert parse_rate(text) == per_second


@pytest.mark.parametrize("text", ["0", "-1/s", "fast", "10/day", "inf", "nan"])
def test_bad_rates(text: str) -> None:
    with pytest.raises(CliError, match="--rate") as info:
        parse_rate(text)
    assert info.value.code == 2


def test_delimiters() -> None:
    assert parse_delimiter(None) == b"\n"
    assert parse_delimiter("\\0") == b"\0"
    assert parse_delimiter("\\x1e") == b"\x1e"
    assert parse_delimiter("||") == b"||"
    with pytest.raises(CliError, match="must not be empty"):
        parse_delimiter("")


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay


async def test_token_bucket_spaces_takes_at_the_rate() -> None:
    fake = FakeTime()
    bucket = TokenBucket(4.0, clock=fake.clock, sleep=fake.sleep)
    for _ in range(9):
        await bucket.take()
    # the first token is there at once, then one every 1/4 s: one sleep per take, no polling
    assert fake.sleeps == pytest.approx([0.25] * 8)
    assert fake.now == pytest.approx(2.0)


async def test_token_bucket_does_not_sleep_when_tokens_have_accrued() -> None:
    fake = FakeTime()
    bucket = TokenBucket(2.0, burst=3, clock=fake.clock, sleep=fake.sleep)
    fake.now += 10.0  # idle: the bucket fills up to its burst, not beyond
    for _ in range(3):
        assert bucket.ready()
        await bucket.take()
    assert fake.sleeps == []
    assert not bucket.ready()
    await bucket.take()
    assert fake.sleeps == pytest.approx([0.5])


def test_pub_and_tail_options_parse() -> None:
    parser = build_parser()
    pub = parser.parse_args(
        ["pub", "--topic", "t", "-d", "\\0", "--rate", "5/s", "--partition", "2", "a", "-"]
    )
    assert (pub.files, pub.delimiter, pub.rate, pub.partition) == (["a", "-"], "\\0", "5/s", 2)
    flags = ["--from", "offset=3", "--exit-at-end", "--tag", "x", "--ext-filter", "{}"]
    tail = parser.parse_args(["tail", "--topic", "t", *flags, "--format", "{body}"])
    assert (tail.channel, tail.start, tail.exit_at_end) == (None, "offset=3", True)
    assert (tail.desired_tag, tail.ext_filter, tail.template) == ("x", "{}", "{body}")
    with pytest.raises(SystemExit):
        parser.parse_args(["pub", "--topic", "t", "--whole-file", "-d", ","])
    with pytest.raises(SystemExit):
        parser.parse_args(["pub", "--topic", "t", "--key", "k", "--partition", "1"])
    with pytest.raises(SystemExit):
        parser.parse_args(["tail", "--topic", "t", "--json", "--format", "{body}"])


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "soon"])
def test_pub_defer_must_be_a_finite_delay(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse refuses the delay (exit 2) before the command runs, so nothing is sent."""
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["pub", "--topic", "t", "--defer", text])
    assert info.value.code == 2
    assert "argument --defer" in capsys.readouterr().err


def test_pub_defer_takes_seconds() -> None:
    assert build_parser().parse_args(["pub", "--topic", "t", "--defer", "2.5"]).defer == 2.5
    assert build_parser().parse_args(["pub", "--topic", "t", "--defer", "0"]).defer == 0.0


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_pub_strategy_is_one_of_the_librarys(name: str) -> None:
    """``--strategy`` takes every name of :data:`nsq_ha.routing.STRATEGIES`; murmur3 (the
    library's default, the fork's Go SDK) when not given."""
    parser = build_parser()
    assert parser.parse_args(["pub", "--topic", "t", "--strategy", name]).strategy == name
    assert parser.parse_args(["pub", "--topic", "t"]).strategy == DEFAULT_STRATEGY.name


def test_pub_refuses_an_unknown_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse refuses it (exit 2) before anything is sent, naming the strategies there are."""
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["pub", "--topic", "t", "--strategy", "crc32"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --strategy: invalid choice: 'crc32'" in err
    assert all(repr(name) in err for name in STRATEGIES), err


def test_pub_help_names_the_strategies_the_summary_and_the_exit_statuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["pub", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in STRATEGIES), text
    assert "not a terminal" in text
    assert "1: some record failed" in text
    assert "130: Ctrl-C" in text


@pytest.mark.parametrize(
    ("pmap", "ordered", "asked"),
    [
        (PartitionMap("t", "r", fork=True), False, True),  # a plain fork topic: SUB_ADVANCED
        (PartitionMap("t", "r", fork=True), True, False),  # --ordered: SUB_ORDERED has them
        (PartitionMap("t", "r"), False, False),  # vanilla nsqlookupd: no offsets, plain SUB
        (None, False, False),  # --nsqd: nothing says it is the fork
    ],
)
def test_tail_asks_for_offsets_on_every_fork_topic(
    pmap: PartitionMap | None, ordered: bool, asked: bool
) -> None:
    """Whatever the output shape (--format, --json, the default line), tail on the fork
    subscribes so that every message carries its offset; never on vanilla."""
    assert wants_offsets(pmap, ordered=ordered) is asked


def test_tail_help_says_what_a_missing_field_prints(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["tail", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "a field the message lacks prints '-' (vanilla nsqd: partition, offset" in text, text
    assert "null for what it lacks" in text, text


def test_tail_takes_the_topic_as_its_first_argument() -> None:
    """``nsq-ha tail orders``, as the admin commands take it; ``--topic`` still works."""
    parser = build_parser()
    assert parser.parse_args(["tail", "orders"]).topic == "orders"
    assert parser.parse_args(["tail", "--topic", "orders", "-n", "1"]).topic == "orders"


@pytest.mark.parametrize(
    ("argv", "topic", "files"),
    [
        (["pub", "orders"], "orders", []),
        (["pub", "orders", "a.txt", "-"], "orders", ["a.txt", "-"]),
        (["pub", "--topic", "orders", "a.txt"], "orders", ["a.txt"]),
        (["pub", "--topic", "orders", "a.txt", "b.txt"], "orders", ["a.txt", "b.txt"]),
        (["pub", "a.txt", "--topic", "orders"], "orders", ["a.txt"]),
    ],
)
def test_pub_takes_the_topic_first_unless_given_as_an_option(
    argv: list[str], topic: str, files: list[str]
) -> None:
    """``nsq-ha pub TOPIC [FILE...]``; with ``--topic T`` every argument is a FILE."""
    args = build_parser().parse_args(argv)
    assert (args.topic, args.files) == (topic, files)


def test_pub_without_a_topic_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["pub"])
    assert info.value.code == 2
    assert "TOPIC (or --topic T)" in capsys.readouterr().err


def test_tail_keeps_the_consumers_max_in_flight_unless_n_is_lower() -> None:
    default = next(
        f.default for f in dataclasses.fields(ConsumerConfig) if f.name == "max_in_flight"
    )
    assert max_in_flight(None) == default
    assert max_in_flight(1) == 1
    assert max_in_flight(default + 1) == default
