"""Where a consumer's channel starts (``start=``): the option's checks, the position each
partition is moved to, and what vanilla nsqd cannot honour. No server: nothing here connects."""

from __future__ import annotations

import math
import subprocess
import sys
import types
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from nsq_ha import sync
from nsq_ha.consumer import Consumer, ConsumerConfig
from nsq_ha.consumer.positions import refuse_on_vanilla, start_body
from nsq_ha.errors import ConfigError, UnsupportedByServerError
from nsq_ha.lookup import PartitionMap

LOOKUPD = "http://127.0.0.1:1"


def config(**options: Any) -> ConsumerConfig:
    options.setdefault("lookupd", LOOKUPD)
    return ConsumerConfig(topic="t", channel="c", **options)


def test_no_start_is_the_default() -> None:
    assert config().start is None


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("earliest", "earliest"),
        ("latest", "latest"),
        (1_700_000_000, 1_700_000_000.0),
        (1_700_000_000.75, 1_700_000_000.75),
        (0, 0.0),
        (datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC), 1_714_564_800.0),
        (datetime(2024, 5, 1, 14, 0, 0, tzinfo=timezone(timedelta(hours=2))), 1_714_564_800.0),
        ({0: 0, 3: 120}, {0: 0, 3: 120}),
        (types.MappingProxyType({1: 35}), {1: 35}),
    ],
)
def test_start_is_kept_in_one_form(given: object, kept: object) -> None:
    """A timestamp (int, float or aware datetime) becomes float Unix seconds; a mapping, a dict
    of its own."""
    chosen = config(start=given).start
    assert chosen == kept
    assert type(chosen) is type(kept)


def test_a_start_mapping_is_copied() -> None:
    offsets = {0: 10}
    chosen = config(start=offsets)
    offsets[0] = 99
    offsets[1] = 0
    assert chosen.start == {0: 10}


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("EARLIEST", "earliest"),
        ("start", "earliest"),
        ("", "earliest"),
        (b"earliest", "start"),
        (True, "start"),
        (False, "start"),
        (-1, "start"),
        (-0.5, "start"),
        (math.nan, "start"),
        (math.inf, "start"),
        (datetime(2024, 5, 1, 12, 0, 0), "tzinfo"),  # naive: local or UTC? refused
        (datetime(1969, 12, 31, 23, 0, 0, tzinfo=UTC), "start"),
        ({}, "no partition"),
        ({True: 0}, "partition"),
        ({"0": 0}, "partition"),
        ({-1: 0}, "partition"),
        ({0.0: 0}, "partition"),
        ({0: -1}, "offset"),
        ({0: True}, "offset"),
        ({0: 1.5}, "offset"),
        ({0: "0"}, "offset"),
        ({0: 2**63}, "offset"),
        ([0, 1], "start"),
        (object(), "start"),
    ],
)
def test_bad_starts_are_config_errors(bad: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config(start=bad)


def test_start_needs_the_lookup() -> None:
    """The start is applied through each partition leader's HTTP API (fork) or decided from
    the topic's channel list (vanilla): both come from nsqlookupd."""
    with pytest.raises(ConfigError, match="lookupd"):
        ConsumerConfig(topic="t", channel="c", nsqd="127.0.0.1:1", start="earliest")


def test_a_start_mapping_names_only_partitions_the_consumer_reads() -> None:
    with pytest.raises(ConfigError, match=r"\[2\]"):
        config(start={0: 0, 2: 0}, partitions=[0, 1])
    with pytest.raises(ConfigError, match=r"\[1\]"):
        config(start={0: 0, 1: 0}, member=(0, 2))
    assert config(start={0: 0, 2: 0}, member=(0, 2)).start == {0: 0, 2: 0}


def test_the_consumers_take_start_and_refuse_a_bad_one_before_anything_starts() -> None:
    assert Consumer("t", "c", lookupd=LOOKUPD, start="earliest").config.start == "earliest"
    with pytest.raises(ConfigError, match="earliest"):
        Consumer("t", "c", lookupd=LOOKUPD, start="first")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="earliest"):
        sync.Consumer("t", "c", lookupd=LOOKUPD, start="first")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("start", "partition", "body"),
    [
        ("earliest", 0, "virtual_queue:0"),
        ("earliest", 7, "virtual_queue:0"),
        ("latest", 0, None),  # a new fork channel starts at the end: nothing to move
        (1_700_000_000.9, 2, "timestamp:1700000000"),  # to the second, rounded down
        ({1: 35, 3: 0}, 1, "virtual_queue:35"),
        ({1: 35, 3: 0}, 3, "virtual_queue:0"),
        ({1: 35, 3: 0}, 0, None),  # not named: left where a new channel starts
    ],
)
def test_the_position_each_partition_of_a_new_channel_is_moved_to(
    start: Any, partition: int, body: str | None
) -> None:
    assert start_body(config(start=start).start, partition) == body


def _vanilla(*channels: str) -> PartitionMap:
    return PartitionMap(topic="t", access="r", channels=channels)


@pytest.mark.parametrize(
    ("start", "pmap", "why"),
    [
        (1_700_000_000, _vanilla(), "needs the fork"),
        (1_700_000_000, _vanilla("c"), "needs the fork"),
        ({0: 0}, _vanilla(), "needs the fork"),
        ({0: 0}, None, "needs the fork"),
        ("earliest", _vanilla("other"), "only messages published after"),
        ("latest", _vanilla(), "everything the topic holds"),
        ("latest", None, "everything the topic holds"),
    ],
)
def test_vanilla_refuses_what_it_cannot_honour(
    start: Any, pmap: PartitionMap | None, why: str
) -> None:
    with pytest.raises(UnsupportedByServerError, match=why) as caught:
        refuse_on_vanilla(config(start=start).start, pmap, "c")
    assert "leave start= out" in str(caught.value)  # what to do next


@pytest.mark.parametrize(
    ("start", "pmap"),
    [
        ("earliest", _vanilla()),  # the topic's first channel gets what the topic buffered
        ("earliest", None),  # a topic lookupd does not know yet: the same
        ("latest", _vanilla("other")),  # a later channel gets only new messages
        ("earliest", _vanilla("c", "other")),  # the channel exists: it keeps its position
        ("latest", _vanilla("c")),
        (None, _vanilla()),
    ],
)
def test_vanilla_accepts_what_it_honours(start: Any, pmap: PartitionMap | None) -> None:
    refuse_on_vanilla(config(start=start).start, pmap, "c")


def test_the_admin_clients_load_only_for_a_start_position_or_a_seek() -> None:
    """``nsq_ha.admin`` (nsqd's and nsqlookupd's HTTP clients) is loaded by the first start
    position applied or seek, not by importing the client or making a consumer."""
    script = (
        "import sys\n"
        "import nsq_ha, nsq_ha.producer, nsq_ha.consumer, nsq_ha.sync\n"
        "from nsq_ha.consumer import Consumer\n"
        "from nsq_ha.consumer.positions import start_body\n"
        "Consumer('t', 'c', lookupd='http://127.0.0.1:1', start='earliest')\n"
        "before = sorted(m for m in sys.modules if m.startswith('nsq_ha.admin'))\n"
        "start_body('earliest', 0)\n"
        "after = 'nsq_ha.admin' in sys.modules\n"
        "print(before, after)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["[]", "True"], done.stdout
