"""``nsq-ha topic expand`` on the embedded broker and the real fork: it grows the topic, waits
until every partition is writable and says so; a refusal is one line on stderr."""

from __future__ import annotations

import json
import secrets

from .backend import Backend
from .cli_run import nsq_ha, ok, one_line_error


def test_expand_grows_the_topic_and_waits_until_every_partition_is_writable(
    backend: Backend,
) -> None:
    topic = f"cli_expand_{secrets.token_hex(3)}"
    where = ("--lookupd", backend.lookupd_http)
    ok(nsq_ha("topic", "create", topic, *where, "--partitions", "2"))
    backend.wait_stable()
    out = ok(nsq_ha("topic", "expand", topic, *where, "--partitions", "3"))
    assert f"topic {topic!r} has 3 partitions, every one writable:" in out
    answer = json.loads(ok(nsq_ha("topic", "expand", topic, *where, "--partitions", "3", "--json")))
    assert sorted(answer["partitions"]) == ["0", "1", "2"]

    fewer = one_line_error(nsq_ha("topic", "expand", topic, *where, "--partitions", "1"), 1)
    assert f"topic {topic!r} has 3 partitions" in fewer
    assert "ask for 3 or more" in fewer


def test_expand_refuses_bad_input_before_asking_anyone() -> None:
    # nothing listens on port 9: a request would fail as unreachable
    where = ("--lookupd", "http://127.0.0.1:9")
    zero = one_line_error(nsq_ha("topic", "expand", "t", *where, "--partitions", "0"), 2)
    assert "partitions must be between 1 and 254, got 0" in zero
    nsqd = one_line_error(
        nsq_ha("topic", "expand", "t", "--nsqd", "127.0.0.1:9", "--partitions", "3"), 2
    )
    assert "give --lookupd URL" in nsqd
