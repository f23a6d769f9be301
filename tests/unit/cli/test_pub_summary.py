"""The summary ``nsq-ha pub`` prints on a terminal (:func:`nsq_ha.cli.rounds.summary_line`):
one line from the same counts as the JSON summary (:meth:`Tally.final`)."""

from __future__ import annotations

from collections import Counter

from nsq_ha.cli.rounds import Tally, summary_line


def _tally(topic: str = "orders") -> Tally:
    return Tally(
        {"topic": topic, "published": 0, "failed": 0, "partitions": {}}, Counter(), Counter()
    )


def _published(tally: Tally, partitions: dict[str, int]) -> None:
    for name, count in partitions.items():
        tally.summary["published"] += count
        tally.per_partition[name] += count


def test_all_published_names_the_topic_and_the_partitions_in_numeric_order() -> None:
    tally = _tally()
    _published(tally, {"10": 1, "2": 3, "0": 2})
    assert summary_line(tally.final(interrupted=False)) == (
        "published 6 of 6 to orders (partitions 0:2 2:3 10:1)"
    )


def test_failures_are_counted_per_distinct_error() -> None:
    tally = _tally()
    _published(tally, {"0": 2, "1": 3})
    tally.failed(6, None, "E_BAD_MESSAGE message too long", as_json=False)
    assert summary_line(tally.final(interrupted=False)) == (
        "published 5 of 6 to orders (partitions 0:2 1:3), 1 failed: "
        "E_BAD_MESSAGE message too long (x1)"
    )


def test_a_topic_without_partitions_shows_none() -> None:
    tally = _tally("plain")
    _published(tally, {"-": 4})
    assert summary_line(tally.final(interrupted=False)) == "published 4 of 4 to plain"


def test_nothing_read() -> None:
    assert summary_line(_tally().final(interrupted=True)) == "published 0 of 0 to orders"


def test_the_line_stays_one_line_and_short_whatever_the_errors() -> None:
    """Errors on several lines are joined, a long one is cut, and past the three commonest the
    rest are counted with a pointer to --json (which lists each record's error)."""
    tally = _tally()
    for _ in range(5):
        tally.failed(1, None, "refused\nby   nsqd", as_json=False)
    tally.failed(2, None, "x" * 1000, as_json=False)
    for number in range(3, 7):
        tally.failed(number, None, f"error {number}", as_json=False)
    line = summary_line(tally.final(interrupted=False))
    assert "\n" not in line
    assert len(line) < 400, line
    assert line.startswith("published 0 of 10 to orders, 10 failed: refused by nsqd (x5); x")
    assert "...(x1)" in line.replace(" (x1)", "(x1)")
    assert line.endswith("; 3 more (--json shows each record)"), line


def test_the_json_summary_keeps_its_fields() -> None:
    """What scripts parse: the counts, per-partition counts, the errors, and ``interrupted``
    only after Ctrl-C."""
    tally = _tally()
    _published(tally, {"1": 1})
    tally.failed(2, "k", "boom", as_json=False)
    assert tally.final(interrupted=False) == {
        "topic": "orders",
        "published": 1,
        "failed": 1,
        "partitions": {"1": 1},
        "errors": [{"error": "boom", "count": 1}],
    }
    assert tally.final(interrupted=True)["interrupted"] is True
