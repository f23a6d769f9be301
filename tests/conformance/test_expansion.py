"""Conformance: partition expansion (``POST /topic/partition/expand`` on lookupd), on the real
fork and on the embedded broker.

The fork's sequence, as the real server showed it: the answer is 200 with an empty body and
``meta.partition_num`` grows at once; an ``access=r`` lookup lists the new partitions a moment
later, ``access=w`` only once lookupd has given them leaders (posting the topic's
``/topic/create`` again nudges that), and meanwhile a PUB to a new partition's nsqd is refused
with ``E_FAILED_ON_NOT_LEADER``. The refusals are checked with their status and message.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from .backends import Backend, TopicDef, wait_for
from .wire import Wire

#: grown from 2 to 3 partitions by the sequence case
GROW = "cf_exp_grow"
#: 2 partitions, never grown: the refusals
KEEP = "cf_exp_keep"
TOPICS = (TopicDef(GROW, partitions=2), TopicDef(KEEP, partitions=2))
V1 = {"Accept": "application/vnd.nsq; version=1.0"}
EXPAND = "/topic/partition/expand"


def _post(backend: Backend, path: str, params: dict[str, str]) -> httpx.Response:
    with httpx.Client(timeout=10.0) as client:
        return client.post(f"{backend.lookupd_http}{path}", params=params, headers=V1)


def _expand(backend: Backend, params: dict[str, str]) -> httpx.Response:
    """POST the expansion; while the fork deems its cluster unstable (right after topics were
    created) it refuses everything with ``the cluster is unstable``: wait that out first."""
    backend.wait_stable()
    deadline = time.monotonic() + 60
    while True:
        resp = _post(backend, EXPAND, params)
        if "unstable" not in resp.text or time.monotonic() > deadline:
            return resp
        time.sleep(1.0)


def _lookup(backend: Backend, topic: str, access: str) -> dict[str, Any]:
    with httpx.Client(timeout=10.0) as client:
        resp = client.get(
            f"{backend.lookupd_http}/lookup",
            params={"topic": topic, "access": access, "metainfo": "true"},
            headers=V1,
        )
    resp.raise_for_status()
    data: dict[str, Any] = resp.json()
    return data.get("data", data)


def _partitions(answer: dict[str, Any]) -> list[int]:
    return sorted(int(p) for p in answer.get("partitions") or {})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"partition_num": "3"}, "MISSING_ARG_TOPIC", id="no-topic"),
        pytest.param({"topic": KEEP}, "MISSING_ARG_TOPIC_PARTITION_NUM", id="no-count"),
        pytest.param(
            {"topic": KEEP, "partition_num": "x"}, "INVALID_ARG_TOPIC_PARTITION_NUM", id="x"
        ),
        pytest.param(
            {"topic": KEEP, "partition_num": "0"}, "INVALID_ARG_TOPIC_PARTITION_NUM", id="zero"
        ),
        pytest.param(
            {"topic": KEEP, "partition_num": "-1"}, "INVALID_ARG_TOPIC_PARTITION_NUM", id="minus"
        ),
        pytest.param(
            {"topic": KEEP, "partition_num": "5000"},
            "INVALID_ARG_TOPIC_PARTITION_NUM",
            id="too-many",
        ),
    ],
)
def test_expand_argument_errors_are_400(
    backend: Backend, params: dict[str, str], message: str
) -> None:
    """A missing or bad argument: 400 with the fork's message."""
    resp = _post(backend, EXPAND, params)
    assert (resp.status_code, resp.json()) == (400, {"message": message})


@pytest.mark.parametrize(
    ("params", "status", "body"),
    [
        pytest.param(
            {"topic": KEEP, "partition_num": "1"},
            500,
            {"message": "the partition number can not be reduced"},
            id="fewer",
        ),
        pytest.param(
            {"topic": "cf_exp_unknown", "partition_num": "3"},
            500,
            {"message": "topic is not created"},
            id="unknown-topic",
        ),
        pytest.param({"topic": KEEP, "partition_num": "2"}, 200, None, id="same-count"),
    ],
)
def test_expand_refusals_and_the_same_count(
    backend: Backend, params: dict[str, str], status: int, body: dict[str, str] | None
) -> None:
    """Fewer partitions and an unknown topic are 500 with the fork's message; the count the
    topic already has is a 200 with an empty body that changes nothing."""
    resp = _expand(backend, params)
    if body is None:
        assert (resp.status_code, resp.text) == (status, "")
    else:
        assert (resp.status_code, resp.json()) == (status, body)
    assert _lookup(backend, KEEP, "r")["meta"]["partition_num"] == 2


def test_expand_is_get_405(backend: Backend) -> None:
    """The route takes POST only."""
    with httpx.Client(timeout=10.0) as client:
        resp = client.get(
            f"{backend.lookupd_http}{EXPAND}", params={"topic": KEEP, "partition_num": "3"}
        )
    assert (resp.status_code, resp.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})


def test_expansion_sequence(backend: Backend) -> None:
    """200 and an empty body; the count grows at once; ``access=r`` lists the new partition
    before ``access=w`` does, and meanwhile its nsqd refuses a PUB to it with
    ``E_FAILED_ON_NOT_LEADER``; after nudges (the topic's ``/topic/create`` again) every
    partition is writable and the new one takes a PUB."""
    resp = _expand(backend, {"topic": GROW, "partition_num": "3"})
    assert (resp.status_code, resp.text) == (200, "")
    assert _lookup(backend, GROW, "r")["meta"]["partition_num"] == 3
    assert _partitions(_lookup(backend, GROW, "w")) == [0, 1]

    def listed() -> dict[str, Any] | None:
        answer = _lookup(backend, GROW, "r")
        return answer if 2 in _partitions(answer) else None

    readable = wait_for(listed, 30.0, "access=r to list the new partition")
    assert _partitions(_lookup(backend, GROW, "w")) == [0, 1]  # not writable yet
    node = readable["partitions"]["2"]
    with Wire(f"{node['broadcast_address']}:{node['tcp_port']}") as w:
        w.command(f"PUB {GROW} 2", b"too early")
        w.expect_error("E_FAILED_ON_NOT_LEADER ")

    create = {"topic": GROW, "partition_num": "3", "replicator": "1", "multipart": "true"}

    def writable() -> dict[str, Any] | None:
        _post(backend, "/topic/create", create)
        answer = _lookup(backend, GROW, "w")
        return answer if _partitions(answer) == [0, 1, 2] else None

    answer = wait_for(writable, 90.0, "every partition to be writable", interval=2.0)
    leader = answer["partitions"]["2"]
    with Wire(f"{leader['broadcast_address']}:{leader['tcp_port']}") as w:
        w.command(f"PUB {GROW} 2", b"in time")
        w.expect_ok()
