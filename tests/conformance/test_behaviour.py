"""Conformance, second module: how the servers *behave* (dispatch, filters, ordered channels,
start positions, counters, admin endpoints), on the real fork and on the devcluster.

The same ``backend`` fixture as :mod:`.test_conformance` (its own clusters, with the topics of
:data:`TOPICS`).  Every case was first run on the real fork; where the fork surprised, the
docstring names the Go source that explains it (youzan/nsq b16e68eb).  No case sleeps to
synchronise: a *sentinel* message that must pass marks the end of what a consumer may get.
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from typing import Any

import httpx
import pytest

from .backends import Backend, TopicDef, wait_for
from .test_conformance import (
    IDENT,
    NEGOTIATED_DEFAULTS,
    NOT_IN_FLIGHT,
    Sub,
    compact,
    ext_body,
    fin,
    fin_failed,
    http,
    lookup,
    mpub_body,
    prove_open_subscribed,
    pub,
    pub_ext,
    pub_trace,
    req,
    req_failed,
    setoffset,
    stats_partition,
    subscribe,
    touch,
)
from .wire import OK, Message, NoFrame, Wire, go_bytes, response_frame

B_PLAIN = "cb_plain"
B_ORD = "cb_ord"
B_EXT = "cb_ext"
B_EMPTY = "cb_empty"
B_NOAUTO = "cb_noauto"
B_TWO = "cb_two"

TOPICS: tuple[TopicDef, ...] = (
    TopicDef(B_PLAIN),
    TopicDef(B_ORD, ordered=True),
    TopicDef(B_EXT, ext=True),
    TopicDef(B_EMPTY),
    TopicDef(B_NOAUTO, channel_auto_create=False),
    TopicDef(B_TWO, partitions=2),
)

EXT_IDENT = {"extend_support": True}
TAG_A = b'{"##client_dispatch_tag":"tagA"}'
TAG_B = b'{"##client_dispatch_tag":"tagB"}'


def read_until(w: Wire, last: bytes, *, ext: bool = False, detail: bool = False) -> list[bytes]:
    """The bodies of the messages ``w`` gets up to and including the one whose body is
    ``last``; each is finished."""
    bodies: list[bytes] = []
    while not bodies or bodies[-1] != last:
        msg = w.read_message(ext=ext, detail=detail)
        bodies.append(msg.body)
        fin(w, msg.id)
    return bodies


def publish(p: Wire, topic: str, header: bytes | None, body: bytes) -> None:
    """PUB_EXT with ``header``, or a plain PUB when it is ``None``."""
    if header is None:
        pub(p, topic, body)
    else:
        assert pub_ext(p, topic, header, body) == OK


def setorder(backend: Backend, topic: str, channel: str, order: str) -> None:
    params = {"topic": topic, "partition": "0", "channel": channel, "order": order}
    resp = http("POST", f"{backend.leader_http(topic)}/channel/setorder", params)
    assert (resp.status_code, resp.text) == (200, "")


# == desired_tag dispatch (§6.10; nsqd/channel.go messagePump, protocol_v2.go messagePump) ====


def test_desired_tag_dispatch(backend: Backend) -> None:
    """A consumer with ``desired_tag`` gets only the messages whose ``##client_dispatch_tag``
    is its tag; messages with another tag, without a tag and plain PUBs go to the untagged
    consumers of the channel."""
    address = backend.leader(B_EXT)
    tagged = Sub(B_EXT, "c_tag", ident={**EXT_IDENT, "desired_tag": "tagA"}, rdy=10)
    untagged = Sub(B_EXT, "c_tag", ident=EXT_IDENT, rdy=10)
    with subscribe(address, tagged) as a, subscribe(address, untagged) as b, Wire(address) as p:
        prove_open_subscribed(a)
        publish(p, B_EXT, TAG_A, b"for-a")
        publish(p, B_EXT, TAG_B, b"tag-b")
        publish(p, B_EXT, b'{"k":"v"}', b"no-tag")
        publish(p, B_EXT, None, b"plain")
        publish(p, B_EXT, TAG_A, b"for-a-2")
        assert read_until(b, b"plain", ext=True) == [b"tag-b", b"no-tag", b"plain"]
        assert read_until(a, b"for-a-2", ext=True) == [b"for-a", b"for-a-2"]
        b.expect_silence(0.3)


def test_desired_tag_on_a_non_ext_topic_is_dropped(backend: Backend) -> None:
    """protocol_v2.go internalSUB: a tag on a non-ext topic is removed at SUB (the IDENTIFY
    answer still echoes it); the consumer then gets every message and ``/stats`` shows no
    tag."""
    address = backend.leader(B_PLAIN)
    with Wire(address) as w, Wire(address) as p:
        w.identify_body({**IDENT, "feature_negotiation": True, "desired_tag": "tagA"})
        w.expect(response_frame(compact({**NEGOTIATED_DEFAULTS, "desired_tag": "tagA"})))
        w.command(f"SUB {B_PLAIN} c_tag_plain 0")
        w.expect_ok()
        w.command("RDY 1")
        pub(p, B_PLAIN, b"to-all")
        assert w.read_message().body == b"to-all"
        entry = stats_partition(backend.leader_http(B_PLAIN), B_PLAIN, 0)
        assert entry is not None
        (channel,) = [c for c in entry["channels"] if c["channel_name"] == "c_tag_plain"]
        assert [c["desired_tag"] for c in channel["clients"]] == [""]


# == ext_filter (§3.2; nsqd/ext_filter.go) ===================================================

#: (header or None for a plain PUB, body): published to every filter case's channel
FILTER_MESSAGES = [
    (b'{"k":"v1"}', b"m1"),
    (b'{"k":"v2x"}', b"m2"),
    (b'{"j":"v1"}', b"m3"),
    (b'{"k":7}', b"m4"),
    (b'{"k":"v1","j":"v1"}', b"m5"),
    (None, b"m6"),
]
ALL = [b"m1", b"m2", b"m3", b"m4", b"m5", b"m6"]
MULTI = [
    {"filter_ext_key": "k", "filter_data": "v2x"},
    {"filter_ext_key": "j", "filter_data": "v1"},
]
#: id -> (ext_filter, the bodies delivered, the header of a sentinel that passes)
FILTERS: dict[str, tuple[dict[str, Any], list[bytes], bytes | None]] = {
    "exact": (
        {"type": 1, "filter_ext_key": "k", "filter_data": "v1"},
        [b"m1", b"m5"],
        b'{"k":"v1"}',
    ),
    "inverse-delivers-no-header": (
        {"type": 1, "filter_ext_key": "k", "filter_data": "v1", "inverse": True},
        [b"m2", b"m3", b"m4", b"m6"],
        None,
    ),
    "regexp": (
        {"type": 2, "filter_ext_key": "k", "filter_data": "^v[0-9]"},
        [b"m1", b"m2", b"m5"],
        b'{"k":"v1"}',
    ),
    # a missing key or a non-string value is matched as "" (getMsgExtFilterStr)
    "regexp-matching-empty": (
        {"type": 2, "filter_ext_key": "k", "filter_data": "^(v1)?$"},
        [b"m1", b"m3", b"m4", b"m5"],
        b'{"k":"v1"}',
    ),
    "glob": (
        {"type": 3, "filter_ext_key": "k", "filter_data": "v*"},
        [b"m1", b"m2", b"m5"],
        b'{"k":"v1"}',
    ),
    "glob-star": ({"type": 3, "filter_ext_key": "k", "filter_data": "*"}, ALL[:5], b'{"k":"v1"}'),
    "glob-inverse": (
        {"type": 3, "filter_ext_key": "k", "filter_data": "v*", "inverse": True},
        [b"m3", b"m4", b"m6"],
        None,
    ),
    "multi-all": (
        {
            "type": 4,
            "filter_ext_key": "all",
            "filter_data_list": [
                {"filter_ext_key": "k", "filter_data": "v1"},
                {"filter_ext_key": "j", "filter_data": "v1"},
            ],
        },
        [b"m5"],
        b'{"k":"v1","j":"v1"}',
    ),
    "multi-any": (
        {"type": 4, "filter_ext_key": "any", "filter_data_list": MULTI},
        [b"m2", b"m3", b"m5"],
        b'{"j":"v1"}',
    ),
    # a relation other than all/any never matches
    "multi-other-relation-inverse": (
        {"type": 4, "filter_ext_key": "one", "filter_data_list": MULTI, "inverse": True},
        ALL,
        None,
    ),
    # NewExtFilter fails: no filter at all (and no inverse)
    "invalid-no-key": ({"type": 1, "filter_data": "v1", "inverse": True}, ALL, None),
    "unsupported-type": ({"type": 9, "filter_ext_key": "k", "filter_data": "v1"}, ALL, None),
    "bad-regexp": (
        {"type": 2, "filter_ext_key": "k", "filter_data": "(", "inverse": True},
        ALL,
        None,
    ),
}


@pytest.mark.parametrize("case", list(FILTERS.values()), ids=list(FILTERS))
def test_ext_filter(
    backend: Backend, case: tuple[dict[str, Any], list[bytes], bytes | None]
) -> None:
    """Each filter type, with and without ``inverse``, over messages with a matching header,
    other values, another key, a number, two keys and no header at all: the consumer gets
    exactly the listed bodies (filtered messages are acknowledged), then the sentinel."""
    ext_filter, expected, sentinel = case
    address = backend.leader(B_EXT)
    channel = f"c_filter_{zlib.crc32(compact(ext_filter)):08x}"
    spec = Sub(B_EXT, channel, ident={**EXT_IDENT, "ext_filter": ext_filter}, rdy=10)
    with subscribe(address, spec) as sub, Wire(address) as p:
        for header, body in FILTER_MESSAGES:
            publish(p, B_EXT, header, body)
        publish(p, B_EXT, sentinel, b"end")
        assert read_until(sub, b"end", ext=True) == [*expected, b"end"]


def test_ext_filter_does_not_apply_to_non_ext_topics(backend: Backend) -> None:
    """protocol_v2.go messagePump: the filter is only used on ext channels."""
    address = backend.leader(B_PLAIN)
    ext_filter = {"type": 1, "filter_ext_key": "k", "filter_data": "v1"}
    with (
        subscribe(
            address, Sub(B_PLAIN, "c_filter_plain", ident={"ext_filter": ext_filter}, rdy=5)
        ) as sub,
        Wire(address) as p,
    ):
        pub(p, B_PLAIN, b"unfiltered")
        assert read_until(sub, b"unfiltered") == [b"unfiltered"]


# == ext headers on TCP (§2.12; fastjson.ParseBytes accepts any JSON value) ===================


@pytest.mark.parametrize("header", [b"[1,2]", b'"text"', b"5", b"null"])
def test_pub_ext_accepts_any_json_value(backend: Backend, header: bytes) -> None:
    """The header only has to be JSON, not an object; it is delivered as it was sent."""
    address = backend.leader(B_EXT)
    channel = f"c_anyjson_{len(header)}"
    with subscribe(address, Sub(B_EXT, channel, ident=EXT_IDENT, rdy=1)) as sub, Wire(address) as p:
        assert pub_ext(p, B_EXT, header, b"any-json") == OK
        msg = sub.read_message(ext=True)
        assert (msg.ext_version, msg.ext, msg.body) == (4, header, b"any-json")


# == IDENTIFY (§2.1, §3.1; nsqd/client_v2.go Identify) =======================================


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        pytest.param(b"null", response_frame(OK), id="null-body"),
        pytest.param(
            b'{"heartbeat_interval":null,"msg_timeout":null}', response_frame(OK), id="null-values"
        ),
        pytest.param(b'{"ext_filter":null}', response_frame(OK), id="ext-filter-null"),
        pytest.param(
            b'{"output_buffer_timeout":-5}',
            b"E_BAD_BODY IDENTIFY output buffer timeout (-5) is invalid",
            id="obt-minus-5",
        ),
        pytest.param(
            b'{"output_buffer_size":-2}',
            b"E_BAD_BODY IDENTIFY output buffer size (-2) is invalid",
            id="obuf-minus-2",
        ),
        pytest.param(
            b'{"HEARTBEAT_INTERVAL":500}',
            b"E_BAD_BODY IDENTIFY heartbeat interval (500) is invalid",
            id="keys-case-insensitive",
        ),
        pytest.param(
            b'{"ext_filter":{"type":"1"}}',
            b"E_BAD_BODY IDENTIFY failed to decode JSON body",
            id="ext-filter-type-string",
        ),
        pytest.param(
            b'{"ext_filter":"x"}',
            b"E_BAD_BODY IDENTIFY failed to decode JSON body",
            id="ext-filter-string",
        ),
        pytest.param(b"[]", b"E_BAD_BODY IDENTIFY failed to decode JSON body", id="array-body"),
        pytest.param(
            b'{"sample_rate":4294967296}',
            b"E_BAD_BODY IDENTIFY failed to decode JSON body",
            id="int32-overflow",
        ),
    ],
)
def test_identify_json_edges(backend: Backend, body: bytes, answer: bytes) -> None:
    """Go's decoder: ``null`` is "nothing set", keys match case-insensitively, every field
    has a type (``ext_filter`` included); errors are fatal, ``OK`` keeps the connection."""
    with Wire(backend.leader(B_PLAIN)) as w:
        w.command("IDENTIFY", body)
        if answer == response_frame(OK):
            w.expect(answer)
            w.command(f"SUB {B_PLAIN} c_ident_edges 0")
            w.expect_ok()
        else:
            w.expect_error_then_closed(answer)


# == ordered channels (§6.7; protocol_v2.go REQ, nsqd/channel.go SetOrdered) =================


def test_ordered_req_with_delay_is_silent_even_when_not_in_flight(backend: Backend) -> None:
    """protocol_v2.go REQ returns before looking the id up when the channel is ordered and
    the delay is positive: no error for an id not in flight; ``REQ <id> 0`` still checks."""
    with subscribe(backend.leader(B_ORD), Sub(B_ORD, "c_ord_reqnif", command="SUB_ORDERED")) as w:
        req(w, NOT_IN_FLIGHT, 1000)
        w.expect_silence(0.3)
        req(w, NOT_IN_FLIGHT, 0)
        w.expect_error(req_failed(NOT_IN_FLIGHT))
        prove_open_subscribed(w)


def test_ordered_fin_of_the_next_id_is_not_in_flight(backend: Backend) -> None:
    """With the head message in flight, a FIN of the following message's id is the non-fatal
    ``not in flight``; the head is still delivered next after its own FIN."""
    address = backend.leader(B_ORD)
    spec = Sub(B_ORD, "c_ord_fin_next", command="SUB_ORDERED", rdy=5)
    with subscribe(address, spec) as sub, Wire(address) as p:
        pub(p, B_ORD, b"head")
        pub(p, B_ORD, b"next")
        head = sub.read_message(detail=True)
        following = struct.pack(">QQ", head.internal_id + 1, 0)
        fin(sub, following)
        sub.expect_error(fin_failed(following))
        fin(sub, head.id)
        nxt = sub.read_message(detail=True)
        assert (nxt.body, nxt.id) == (b"next", following)
        fin(sub, nxt.id)


def test_ordered_two_consumers_share_one_in_flight(backend: Backend) -> None:
    """Two SUB_ORDERED consumers of one channel: one message in flight between them."""
    address = backend.leader(B_ORD)
    spec = Sub(B_ORD, "c_ord_two", command="SUB_ORDERED", rdy=5)
    with subscribe(address, spec) as a, subscribe(address, spec) as b, Wire(address) as p:
        pub(p, B_ORD, b"one")
        pub(p, B_ORD, b"two")
        got: list[tuple[Wire, Message]] = []
        for w in (a, b):
            with contextlib.suppress(NoFrame):
                got.append((w, w.read_message(detail=True, timeout=1.0)))
        assert [m.body for _, m in got] == [b"one"]
        holder, msg = got[0]
        fin(holder, msg.id)
        bodies = []
        for w in (a, b):
            try:
                second = w.read_message(detail=True, timeout=1.0)
            except NoFrame:
                continue
            bodies.append(second.body)
            fin(w, second.id)
        assert bodies == [b"two"]


def test_sub_ordered_turns_a_plain_channel_ordered(backend: Backend) -> None:
    """SUB_ORDERED on a non-ordered topic makes the channel ordered: a plain SUB consumer of
    it then gets one message at a time."""
    address = backend.leader(B_PLAIN)
    with subscribe(address, Sub(B_PLAIN, "c_made_ordered", command="SUB_ORDERED")):
        pass
    with subscribe(address, Sub(B_PLAIN, "c_made_ordered", rdy=5)) as sub, Wire(address) as p:
        pub(p, B_PLAIN, b"o-1")
        pub(p, B_PLAIN, b"o-2")
        first = sub.read_message()
        sub.expect_silence(0.5)
        fin(sub, first.id)
        assert sub.read_message().body == b"o-2"


def test_setorder_false_closes_the_consumers(backend: Backend) -> None:
    """nsqd/channel.go SetOrdered(false): every consumer of an ordered channel is closed (no
    error frame); the channel is then plain."""
    address = backend.leader(B_PLAIN)
    with subscribe(address, Sub(B_PLAIN, "c_order_off", command="SUB_ORDERED", rdy=1)) as sub:
        setorder(backend, B_PLAIN, "c_order_off", "false")
        sub.expect_closed()
    with subscribe(address, Sub(B_PLAIN, "c_order_off", rdy=5)) as sub, Wire(address) as p:
        pub(p, B_PLAIN, b"p-1")
        pub(p, B_PLAIN, b"p-2")
        assert [sub.read_message().body, sub.read_message().body] == [b"p-1", b"p-2"]


def test_setorder_keeps_consumers_otherwise(backend: Backend) -> None:
    """``order=false`` on a plain channel and ``order=true`` close nobody; after
    ``order=true`` a plain SUB consumer gets one message at a time."""
    address = backend.leader(B_PLAIN)
    with subscribe(address, Sub(B_PLAIN, "c_order_on")) as sub, Wire(address) as p:
        setorder(backend, B_PLAIN, "c_order_on", "false")
        setorder(backend, B_PLAIN, "c_order_on", "true")
        prove_open_subscribed(sub)
        pub(p, B_PLAIN, b"s-1")
        pub(p, B_PLAIN, b"s-2")
        sub.command("RDY 5")
        first = sub.read_message()
        sub.expect_silence(0.5)
        fin(sub, first.id)
        assert sub.read_message().body == b"s-2"


# == start positions (§2.3.1; protocol_v2.go internalSUB → SetChannelOffset) ================


@pytest.mark.parametrize(
    ("start", "error"),
    [
        pytest.param("virtual_queue:0", "E_INVALID commit log end of file", id="virtual_queue"),
        pytest.param("msgcount:1", "E_INVALID commit log end of file", id="msgcount"),
        pytest.param("timestamp:0", "E_INVALID commit log end of file", id="timestamp"),
        pytest.param("special:-1", None, id="special"),
    ],
)
def test_sub_advanced_start_on_an_empty_partition(
    backend: Backend, start: str, error: str | None
) -> None:
    """A start position that seeks into a commit log without any record fails the SUB."""
    with Wire(backend.leader(B_EMPTY)) as w:
        w.command(f"SUB_ADVANCED {B_EMPTY} c_start_empty_{start.split(':')[0]} 0 {start}")
        if error is None:
            w.expect_ok()
            prove_open_subscribed(w)
        else:
            w.expect_error_then_closed(error)


def test_start_position_only_from_the_first_consumer(backend: Backend) -> None:
    """protocol_v2.go internalSUB: a second consumer's start position is ignored; the first
    one's (``msgcount:2`` on a 3-message log) holds."""
    address = backend.leader(B_PLAIN)
    with Wire(address) as p:
        for i in range(3):
            pub(p, B_PLAIN, b"pos-%d" % i)
        entry = stats_partition(backend.leader_http(B_PLAIN), B_PLAIN, 0)
        assert entry is not None
        count = entry["message_count"]
    with Wire(address) as a:
        a.command(f"SUB_ADVANCED {B_PLAIN} c_start_first 0 msgcount:{count - 1}")
        a.expect_ok()
        with Wire(address) as b:
            b.command(f"SUB_ADVANCED {B_PLAIN} c_start_first 0 special:-1")
            b.expect_ok()
            b.command("RDY 5")
            assert read_until(b, b"pos-2", detail=True) == [b"pos-1", b"pos-2"]


# == channel lifetime and attempts (§4.5; nsqd/channel.go RequeueClientMessages) =============


def test_attempts_kept_when_the_consumer_disconnects(backend: Backend) -> None:
    """A message in flight when its consumer goes away comes back with the same attempts
    (the requeue is not the client's: RequeueMessage(byClient=false) takes one back)."""
    address = backend.leader(B_PLAIN)
    with Wire(address) as p:
        with subscribe(address, Sub(B_PLAIN, "c_disc", rdy=1)) as first:
            pub(p, B_PLAIN, b"held")
            msg = first.read_message()
            assert msg.attempts == 1
        with subscribe(address, Sub(B_PLAIN, "c_disc", rdy=1)) as second:
            again = second.read_message()
            assert (again.id, again.attempts, again.body) == (msg.id, 1, b"held")
            req(second, again.id, 0)
            third = second.read_message()
            assert third.attempts == 2
            fin(second, third.id)


def test_channel_keeps_its_backlog_without_consumers(backend: Backend) -> None:
    """A channel without consumers keeps what is published meanwhile; a new channel starts
    at the end."""
    address = backend.leader(B_PLAIN)
    with subscribe(address, Sub(B_PLAIN, "c_backlog")), Wire(address) as p:
        pub(p, B_PLAIN, b"kept-before")
    with Wire(address) as p:
        pub(p, B_PLAIN, b"kept-1")
        with subscribe(address, Sub(B_PLAIN, "c_backlog", rdy=5)) as sub:
            assert read_until(sub, b"kept-1") == [b"kept-before", b"kept-1"]
        with subscribe(address, Sub(B_PLAIN, "c_backlog_new", rdy=5)) as fresh:
            pub(p, B_PLAIN, b"after-new")
            assert read_until(fresh, b"after-new") == [b"after-new"]


def test_an_ephemeral_channel_goes_when_its_last_consumer_leaves(backend: Backend) -> None:
    """``#ephemeral`` channels: the fork deletes one when its last client leaves
    (nsqd/channel.go RemoveClient), not before; a durable channel stays."""
    address = backend.leader(B_PLAIN)
    url = backend.http_url(address)
    name = "c_eph#ephemeral"

    def channels() -> list[str]:
        entry = stats_partition(url, B_PLAIN, 0) or {}
        return sorted(c["channel_name"] for c in entry.get("channels") or ())

    with subscribe(address, Sub(B_PLAIN, name)) as first:
        with subscribe(address, Sub(B_PLAIN, name)):
            prove_open_subscribed(first)
        prove_open_subscribed(first)  # one consumer left: the channel stays
        assert name in channels()
        with subscribe(address, Sub(B_PLAIN, "c_eph_durable")):
            pass
    wait_for(lambda: name not in channels(), 10.0, f"{name} deleted")
    assert "c_eph_durable" in channels()


# == /stats counters (§5.6; nsqd/channel.go doRequeue counts every requeue) =================


def test_stats_counters_after_timeout_req_and_fin(backend: Backend) -> None:
    """A message timed out once, requeued once by REQ 0 and finished: the channel counts 2
    requeues (the timeout's too) and 1 timeout; the client 1 requeue, 1 timeout, 1 finish
    and 3 messages."""
    address = backend.leader(B_PLAIN)
    url = backend.http_url(address)
    spec = Sub(B_PLAIN, "c_counters", ident={"msg_timeout": 1000}, rdy=1)
    with subscribe(address, spec) as sub, Wire(address) as p:
        pub(p, B_PLAIN, b"count-me")
        first = sub.read_message()
        timed_out = sub.read_message(timeout=15.0)
        assert timed_out.attempts == 2
        req(sub, first.id, 0)
        last = sub.read_message()
        assert last.attempts == 3
        fin(sub, last.id)
        prove_open_subscribed(sub)
        want = {"requeue_count": 2, "timeout_count": 1, "in_flight_count": 0, "depth": 0}
        want_client = {
            "requeue_count": 1,
            "timeout_count": 1,
            "finish_count": 1,
            "message_count": 3,
            "in_flight_count": 0,
        }

        def counters() -> tuple[dict[str, Any], dict[str, Any]] | None:
            entry = stats_partition(url, B_PLAIN, 0)
            assert entry is not None
            (channel,) = [c for c in entry["channels"] if c["channel_name"] == "c_counters"]
            (client,) = channel["clients"]
            got = ({k: channel[k] for k in want}, {k: client[k] for k in want_client})
            return got if got == (want, want_client) else None

        wait_for(counters, 10.0, f"counters {want} {want_client}")


# == lookupd (§5.2-5.4) =======================================================================


def test_lookup_meta_multi_part_of_an_ordered_topic(backend: Backend) -> None:
    """An ``orderedmulti=true&multipart=true`` topic (how both backends create ordered
    topics) reports ``multi_part: true`` in lookup meta and ``/topics?metaInfo=true``."""
    meta = lookup(backend, {"topic": B_ORD, "access": "r", "metainfo": "true"}).json()["meta"]
    assert (meta["ordered"], meta["multi_part"]) == (True, True)
    infos = http("GET", f"{backend.lookupd_http}/topics", {"metaInfo": "true"}).json()
    (info,) = [i for i in infos["meta_info"] if i["topic_name"] == B_ORD]
    assert (info["ordered"], info["multi_part"]) == (True, True)
    assert B_ORD in infos["topics"]


def test_disable_channel_auto_create(backend: Backend) -> None:
    """A topic created with ``disable_channel_auto_create``: meta says so, SUB to an
    unregistered channel is refused; after lookupd's ``/channel/create`` it works and
    ``/channels`` lists it."""
    meta = lookup(backend, {"topic": B_NOAUTO, "metainfo": "true"}).json()["meta"]
    assert meta["disable_channel_auto_create"] is True
    address = backend.leader(B_NOAUTO)
    with Wire(address) as w:
        w.command(f"SUB {B_NOAUTO} c_unregistered 0")
        w.expect_error_then_closed(
            "E_SUB_CHANNEL_NOT_REGISTERED channel is not registered under topic."
        )
    params = {"topic": B_NOAUTO, "channel": "c_registered"}
    resp = http("POST", f"{backend.lookupd_http}/channel/create", params)
    assert resp.status_code == 200, resp.text

    def registered() -> bool:
        with Wire(address) as w:
            w.command(f"SUB {B_NOAUTO} c_registered 0")
            return w.read_frame().data == OK

    wait_for(registered, 30.0, "the registered channel to be subscribable", interval=0.5)
    channels = http("GET", f"{backend.lookupd_http}/channels", {"topic": B_NOAUTO}).json()
    assert "c_registered" in channels["channels"]


# == nsqd HTTP (§5.6) =========================================================================


def test_http_mpub_text_and_binary(backend: Backend) -> None:
    """``/mpub`` splits text on newlines (empty lines skipped); ``binary`` is framed."""
    address = backend.leader(B_PLAIN)
    url = backend.http_url(address)
    with subscribe(address, Sub(B_PLAIN, "c_http_mpub", rdy=10)) as sub:
        text = http(
            "POST", f"{url}/mpub", {"topic": B_PLAIN, "partition": "0"}, content=b"t-1\n\nt-2\n"
        )
        assert (text.status_code, text.text) == (200, "OK")
        params = {"topic": B_PLAIN, "partition": "0", "binary": "true"}
        binary = http("POST", f"{url}/mpub", params, content=mpub_body([b"b-1", b"b\n2"]))
        assert (binary.status_code, binary.text) == (200, "OK")
        assert read_until(sub, b"b\n2") == [b"t-1", b"t-2", b"b-1", b"b\n2"]
        bad = http("POST", f"{url}/mpub", params, content=struct.pack(">I", 0))
        assert (bad.status_code, bad.json()) == (413, {"message": "BAD_BODY"})


def test_http_pub_ext_headers(backend: Backend) -> None:
    """``/pub_ext``: the ``ext`` JSON plus ``X-Nsqext-*`` headers (lower-cased names) make the
    message's header; a ``##client_dispatch_tag`` header routes it to the tagged consumer."""
    address = backend.leader(B_EXT)
    url = backend.http_url(address)
    tagged = Sub(B_EXT, "c_http_ext", ident={**EXT_IDENT, "desired_tag": "tagH"}, rdy=5)
    with subscribe(address, tagged) as sub:
        prove_open_subscribed(sub)
        with httpx.Client(timeout=10.0) as client:
            resp = client.post(
                f"{url}/pub_ext",
                params={"topic": B_EXT, "partition": "0", "ext": '{"a":"1"}'},
                headers={"X-Nsqext-Color": "red", "X-Nsqext-##client_dispatch_tag": "tagH"},
                content=b"via-http",
            )
        assert (resp.status_code, resp.text) == (200, "OK")
        msg = sub.read_message(ext=True)
        assert msg.body == b"via-http"
        assert msg.ext == b'{"##client_dispatch_tag":"tagH","a":"1","color":"red"}'


def test_http_channel_pause_and_unpause(backend: Backend) -> None:
    """A paused channel delivers nothing (``/stats`` says ``paused``); unpause releases."""
    address = backend.leader(B_PLAIN)
    url = backend.http_url(address)
    params = {"topic": B_PLAIN, "partition": "0", "channel": "c_pause"}
    with subscribe(address, Sub(B_PLAIN, "c_pause", rdy=5)) as sub, Wire(address) as p:
        resp = http("POST", f"{url}/channel/pause", params)
        assert (resp.status_code, resp.text) == (200, "")
        pub(p, B_PLAIN, b"while-paused")
        sub.expect_silence(0.5)
        entry = stats_partition(url, B_PLAIN, 0)
        assert entry is not None
        assert [c["paused"] for c in entry["channels"] if c["channel_name"] == "c_pause"] == [True]
        resp = http("POST", f"{url}/channel/unpause", params)
        assert (resp.status_code, resp.text) == (200, "")
        assert sub.read_message().body == b"while-paused"
    missing = http("POST", f"{url}/channel/pause", {**params, "channel": "c_never"})
    assert (missing.status_code, missing.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})


def test_http_pub_errors(backend: Backend) -> None:
    """``/pub`` without a body is 406 ``MSG_EMPTY``; a bad topic name 404; ``/pubtrace`` with
    a bad trace id 400 ``INVALID_TRACE_ID``."""
    url = backend.leader_http(B_PLAIN)
    empty = http("POST", f"{url}/pub", {"topic": B_PLAIN}, content=b"")
    assert (empty.status_code, empty.json()) == (406, {"message": "MSG_EMPTY"})
    bad_name = http("POST", f"{url}/pub", {"topic": "bad!name"}, content=b"x")
    assert (bad_name.status_code, bad_name.json()) == (404, {"message": "E_TOPIC_NOT_EXIST"})
    params = {"topic": B_PLAIN, "partition": "0", "trace_id": "abc"}
    bad_trace = http("POST", f"{url}/pubtrace", params, content=b"x")
    assert (bad_trace.status_code, bad_trace.json()) == (400, {"message": "INVALID_TRACE_ID"})


def test_ext_mpub_ext_body(backend: Backend) -> None:
    """MPUB_EXT on an ext topic: headers kept per message, an empty header is version 0."""
    address = backend.leader(B_EXT)
    with (
        subscribe(address, Sub(B_EXT, "c_mpub_ext", ident=EXT_IDENT, rdy=5)) as sub,
        Wire(address) as p,
    ):
        batch = mpub_body([ext_body(b'{"x":"1"}', b"e-1"), ext_body(b"", b"e-2")])
        p.command(f"MPUB_EXT {B_EXT} 0", batch)
        p.expect_ok()
        one, two = sub.read_message(ext=True), sub.read_message(ext=True)
        assert (one.ext_version, one.ext, one.body) == (4, b'{"x":"1"}', b"e-1")
        assert (two.ext_version, two.body) == (0, b"e-2")


# == more: IDENTIFY limits, deferred REQ, start positions past the end, admin =================


@pytest.mark.parametrize(
    ("asked", "answer"),
    [
        pytest.param({"msg_timeout": 900000}, {"msg_timeout": 900000}, id="msg-timeout-max"),
        pytest.param(
            {"output_buffer_timeout": 1000}, {"output_buffer_timeout": 1000}, id="obt-max"
        ),
        pytest.param({"output_buffer_size": 64}, {"output_buffer_size": 64}, id="obuf-min"),
        pytest.param({"sample_rate": 99}, {"sample_rate": 99}, id="sample-rate-max"),
        pytest.param({"heartbeat_interval": 60000}, {}, id="hb-max"),
        pytest.param({"desired_tag": "t" * 100}, {"desired_tag": "t" * 100}, id="tag-100"),
        pytest.param({"deflate": True, "deflate_level": 9}, None, id="deflate-needs-negotiation"),
    ],
)
def test_identify_limits_accepted(
    backend: Backend, asked: dict[str, Any], answer: dict[str, Any] | None
) -> None:
    """The largest (smallest) accepted values are echoed; without ``feature_negotiation`` no
    compression is set up and the answer is ``OK``."""
    with Wire(backend.leader(B_PLAIN)) as w:
        negotiate = answer is not None
        w.identify_body({**IDENT, "feature_negotiation": negotiate, **asked})
        expected = compact({**NEGOTIATED_DEFAULTS, **(answer or {})}) if negotiate else OK
        w.expect(response_frame(expected))
        w.command(f"SUB {B_PLAIN} c_ident_limits 0")
        w.expect_ok()


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        pytest.param({"msg_timeout": 900001}, "msg timeout (900001) is invalid", id="msg-timeout"),
        pytest.param(
            {"heartbeat_interval": 60001}, "heartbeat interval (60001) is invalid", id="hb"
        ),
        pytest.param(
            {"heartbeat_interval": 999}, "heartbeat interval (999) is invalid", id="hb-999"
        ),
        pytest.param(
            {"output_buffer_timeout": 1001}, "output buffer timeout (1001) is invalid", id="obt"
        ),
        pytest.param({"sample_rate": -1}, "sample rate (-1) is invalid", id="sample-rate-minus-1"),
        pytest.param({"msg_timeout": -1}, "msg timeout (-1) is invalid", id="msg-timeout-minus-1"),
    ],
)
def test_identify_limits_refused(backend: Backend, fields: dict[str, Any], error: str) -> None:
    """One past each limit is the fatal ``E_BAD_BODY IDENTIFY <message>``."""
    with Wire(backend.leader(B_PLAIN)) as w:
        w.identify_body({**IDENT, **fields})
        w.expect_error_then_closed(f"E_BAD_BODY IDENTIFY {error}")


def test_stats_client_identity(backend: Backend) -> None:
    """``/stats`` shows a client's tag, sample rate, RDY and its ``ext_filter`` as Go marshals
    it (``omitempty``: false and empty fields left out)."""
    address = backend.leader(B_EXT)
    ext_filter = {"type": 1, "filter_ext_key": "k", "filter_data": "v", "inverse": False}
    ident = {**EXT_IDENT, "desired_tag": "tagS", "sample_rate": 0, "ext_filter": ext_filter}
    with subscribe(address, Sub(B_EXT, "c_stats_ident", ident=ident, rdy=7)) as sub:
        prove_open_subscribed(sub)
        entry = stats_partition(backend.http_url(address), B_EXT, 0)
        assert entry is not None
        (channel,) = [c for c in entry["channels"] if c["channel_name"] == "c_stats_ident"]
        (client,) = channel["clients"]
        got = {k: client[k] for k in ("desired_tag", "sample_rate", "ready_count", "ext_filter")}
        assert got == {
            "desired_tag": "tagS",
            "sample_rate": 0,
            "ready_count": 7,
            "ext_filter": {"type": 1, "filter_ext_key": "k", "filter_data": "v"},
        }


def test_req_with_delay_counters(backend: Backend) -> None:
    """nsqd/channel.go RequeueMessage: a deferred message stays in the channel's in-flight
    table (``in_flight_count`` 1, ``deferred_count`` 1) and counts as a channel requeue only
    when it comes back; the client counts its requeue at once."""
    address = backend.leader(B_PLAIN)
    url = backend.http_url(address)
    with subscribe(address, Sub(B_PLAIN, "c_deferred", rdy=1)) as sub, Wire(address) as p:
        pub(p, B_PLAIN, b"deferred")
        msg = sub.read_message()
        req(sub, msg.id, 60000)
        prove_open_subscribed(sub)
        keys = ("in_flight_count", "deferred_count", "requeue_count")
        entry = stats_partition(url, B_PLAIN, 0)
        assert entry is not None
        (channel,) = [c for c in entry["channels"] if c["channel_name"] == "c_deferred"]
        (client,) = channel["clients"]
        assert {k: channel[k] for k in keys} == {
            "in_flight_count": 1,
            "deferred_count": 1,
            "requeue_count": 0,
        }
        assert (client["in_flight_count"], client["requeue_count"]) == (0, 1)


@pytest.mark.parametrize("start", ["virtual_queue:99999999", "msgcount:99999999"])
def test_sub_advanced_start_past_the_end(backend: Backend, start: str) -> None:
    """A start position past the end of a log that has records is accepted; the consumer
    gets what is published next."""
    address = backend.leader(B_PLAIN)
    with Wire(address) as p:
        pub(p, B_PLAIN, b"before-past-end")
        with Wire(address) as w:
            w.command(f"SUB_ADVANCED {B_PLAIN} c_past_{start.split(':')[0]} 0 {start}")
            w.expect_ok()
            w.command("RDY 5")
            pub(p, B_PLAIN, b"after-past-end")
            got = read_until(w, b"after-past-end", detail=True)
            assert got == [b"after-past-end"]


def test_lookupd_tombstone_hides_the_node_from_writers(backend: Backend) -> None:
    """``/topic/tombstone``: the node's partitions leave ``access=w`` lookups (readers still
    see them) until ``restore=true``."""
    address = backend.leader(B_PLAIN)
    node = backend.http_url(address).removeprefix("http://")
    params = {"topic": B_PLAIN, "node": node}
    try:
        resp = http("POST", f"{backend.lookupd_http}/topic/tombstone", params)
        assert (resp.status_code, resp.text) == (200, "")
        write = lookup(backend, {"topic": B_PLAIN, "access": "w"}).json()
        assert (write["partitions"], write["producers"]) == ({}, [])
        read = lookup(backend, {"topic": B_PLAIN, "access": "r"}).json()
        assert list(read["partitions"]) == ["0"]
    finally:
        http("POST", f"{backend.lookupd_http}/topic/tombstone", {**params, "restore": "true"})
    write = lookup(backend, {"topic": B_PLAIN, "access": "w"}).json()
    assert list(write["partitions"]) == ["0"]
    missing = http("POST", f"{backend.lookupd_http}/topic/tombstone", {"topic": B_PLAIN})
    assert (missing.status_code, missing.json()) == (400, {"message": "MISSING_ARG_NODE"})


def test_lookupd_topics_and_channels(backend: Backend) -> None:
    """``/topics`` lists every topic; ``/channels`` a topic's channels (an unknown topic: an
    empty list; no topic: 400)."""
    address = backend.leader(B_EXT)
    with subscribe(address, Sub(B_EXT, "c_listed", ident=EXT_IDENT)):
        topics = http("GET", f"{backend.lookupd_http}/topics").json()
        assert list(topics) == ["topics"]
        assert {B_PLAIN, B_ORD, B_EXT, B_EMPTY, B_NOAUTO} <= set(topics["topics"])
        wait_for(
            lambda: (
                "c_listed"
                in http("GET", f"{backend.lookupd_http}/channels", {"topic": B_EXT}).json()[
                    "channels"
                ]
            ),
            10.0,
            "c_listed in /channels",
        )
    unknown = http("GET", f"{backend.lookupd_http}/channels", {"topic": "cb_unknown"})
    assert (unknown.status_code, unknown.json()) == (200, {"channels": []})
    none = http("GET", f"{backend.lookupd_http}/channels")
    assert (none.status_code, none.json()) == (400, {"message": "MISSING_ARG_TOPIC"})


def test_lookupd_lists_channels_in_registration_order(backend: Backend) -> None:
    """``/channels`` and ``/lookup`` list a topic's channels in the order nsqd registered
    them, across partitions (not grouped by partition); ``partition=`` keeps that order."""
    order = [("c_zz", 0), ("c_aa", 1), ("c_mm", 0), ("c_bb", 1)]
    with contextlib.ExitStack() as stack:
        for channel, partition in order:
            address = backend.leader(B_TWO, partition)
            stack.enter_context(subscribe(address, Sub(B_TWO, channel, partition=partition)))

            def registered(name: str = channel) -> bool:
                query = {"topic": B_TWO}
                listed = http("GET", f"{backend.lookupd_http}/channels", query).json()
                return name in listed["channels"]

            wait_for(registered, 10.0, f"{channel} registered")
        names = [c for c, _ in order]
        listed = http("GET", f"{backend.lookupd_http}/channels", {"topic": B_TWO}).json()
        assert listed == {"channels": names}
        first = http(
            "GET", f"{backend.lookupd_http}/channels", {"topic": B_TWO, "partition": "0"}
        ).json()
        assert first == {"channels": ["c_zz", "c_mm"]}
        looked_up = lookup(backend, {"topic": B_TWO, "access": "r"}).json()
        assert looked_up["channels"] == names


@pytest.mark.parametrize(
    "start",
    ["special", "special:-1:0", "timestamp", "msgcount:1:", "virtual_queue", "offset:1"],
)
def test_sub_advanced_start_needs_one_colon_and_a_known_type(backend: Backend, start: str) -> None:
    """A start token is ``<type>:<int>`` with exactly one colon (ConsumeOffset.FromBytes):
    anything else is the fatal ``E_INVALID invalid consume offset:<token>``."""
    address = backend.leader(B_PLAIN)
    with Wire(address) as w:
        w.command(f"SUB_ADVANCED {B_PLAIN} c_bad_start 0 {start}")
        w.expect_error_then_closed(f"E_INVALID invalid consume offset:{start}")


def test_topic_create_without_enough_nodes_is_the_coordinators_error(backend: Backend) -> None:
    """More replicas than nodes: 400 with the coordinator's ErrNodeUnavailable as text."""
    query = {"topic": "cb_too_many_replicas", "partition_num": "1", "replicator": "5"}
    resp = http("POST", f"{backend.lookupd_http}/topic/create", query)
    assert (resp.status_code, resp.json()) == (
        400,
        {"message": "ErrType:9 ErrCode:1 : No node is available for topic"},
    )


def test_http_channel_skip_and_unskip(backend: Backend) -> None:
    """``/channel/skip``: nothing is delivered and ``skipped`` shows in ``/stats`` (what is
    published meanwhile counts in depth until the fork's next flush moves a skipped channel to
    the end, nsqd/channel.go Flush: 2 or 0 here); ``/channel/unskip`` moves the channel to the
    end: only what follows is delivered. Both 404 ``CHANNEL_NOT_FOUND`` for a channel nsqd
    lacks."""
    address = backend.leader(B_PLAIN)
    url = backend.http_url(address)
    params = {"topic": B_PLAIN, "partition": "0", "channel": "c_skipped"}

    def channel() -> dict[str, Any]:
        entry = stats_partition(url, B_PLAIN, 0) or {}
        (found,) = [c for c in entry["channels"] if c["channel_name"] == "c_skipped"]
        return dict(found)

    with subscribe(address, Sub(B_PLAIN, "c_skipped", rdy=5)) as sub, Wire(address) as p:
        resp = http("POST", f"{url}/channel/skip", params)
        assert (resp.status_code, resp.text) == (200, "")
        pub(p, B_PLAIN, b"skip-1")
        pub(p, B_PLAIN, b"skip-2")
        sub.expect_silence(1.0)
        skipped = channel()
        assert (skipped["skipped"], skipped["depth"] in (0, 2)) == (True, True), skipped
        resp = http("POST", f"{url}/channel/unskip", params)
        assert (resp.status_code, resp.text) == (200, "")
        assert channel()["skipped"] is False
        pub(p, B_PLAIN, b"skip-3")
        assert read_until(sub, b"skip-3") == [b"skip-3"]
    missing = {**params, "channel": "c_never"}
    for path in ("skip", "unskip"):
        resp = http("POST", f"{url}/channel/{path}", missing)
        assert (resp.status_code, resp.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})


def test_http_pub_ext_errors(backend: Backend) -> None:
    """``/pub_ext`` into a non-ext topic is 400 ``E_EXT_NOT_SUPPORT``; a header that is not
    JSON 400 ``E_INVALID_JSON_HEADER``; ``/pubtrace`` without ``trace_id`` 400."""
    plain = backend.leader_http(B_PLAIN)
    ext = backend.leader_http(B_EXT)
    cases = [
        (f"{plain}/pub_ext", {"topic": B_PLAIN, "ext": '{"a":"1"}'}, "E_EXT_NOT_SUPPORT"),
        (f"{ext}/pub_ext", {"topic": B_EXT, "ext": '{"a":'}, "E_INVALID_JSON_HEADER"),
        (f"{plain}/pubtrace", {"topic": B_PLAIN}, "INVALID_TRACE_ID"),
    ]
    for url, params, message in cases:
        resp = http("POST", url, params, content=b"x")
        assert (resp.status_code, resp.json()) == (400, {"message": message}), url


def test_http_channel_empty_and_delete(backend: Backend) -> None:
    """``/channel/empty`` drops the backlog (the consumer gets only what follows);
    ``/channel/delete`` closes the channel's consumers."""
    address = backend.leader(B_PLAIN)
    url = backend.http_url(address)
    params = {"topic": B_PLAIN, "partition": "0", "channel": "c_emptied"}
    with subscribe(address, Sub(B_PLAIN, "c_emptied", rdy=0)) as sub, Wire(address) as p:
        pub(p, B_PLAIN, b"dropped")
        wait_for(
            lambda: (
                [
                    c["depth"]
                    for c in (stats_partition(url, B_PLAIN, 0) or {})["channels"]
                    if c["channel_name"] == "c_emptied"
                ]
                == [1]
            ),
            10.0,
            "depth 1",
        )
        resp = http("POST", f"{url}/channel/empty", params)
        assert (resp.status_code, resp.text) == (200, "")
        pub(p, B_PLAIN, b"kept")
        sub.command("RDY 5")
        # the real nsqd may already hold the first message it read ahead (as after setoffset)
        assert read_until(sub, b"kept") in ([b"kept"], [b"dropped", b"kept"])
        resp = http("POST", f"{url}/channel/delete", params)
        assert (resp.status_code, resp.text) == (200, "")
        sub.expect_closed()


def owner_error(frame_data: bytes, what: str, msg_id: bytes, reason: str) -> tuple[int, int]:
    """The two client numbers of a ``client does not own message`` error (nsqd numbers its
    TCP clients in connection order) after checking the rest of the text."""
    prefix = "ErrType:7 ErrCode:0 : " if what == "FIN" else ""
    head = f"E_{what}_FAILED {what} {go_bytes(msg_id)} failed {prefix}{reason}: ".encode()
    assert frame_data.startswith(head), frame_data
    holder, _, me = frame_data[len(head) :].decode().partition(" vs ")
    return int(holder), int(me)


def test_fin_req_touch_of_another_clients_or_a_deferred_message(backend: Backend) -> None:
    """channel.go popInFlightMessage/RequeueMessage: a message in flight for another
    consumer of the channel is refused with both client numbers; a message deferred by a
    REQ with a delay belongs to client 0, and a second delayed REQ is ``Message is
    deferred``.  All non-fatal."""
    address = backend.leader(B_PLAIN)
    spec = Sub(B_PLAIN, "c_owner", rdy=1)
    with subscribe(address, spec) as a, subscribe(address, spec) as b, Wire(address) as p:
        pub(p, B_PLAIN, b"own-1")
        pub(p, B_PLAIN, b"own-2")
        mine, theirs = a.read_message(), b.read_message()
        fin(a, theirs.id)
        holder, me = owner_error(
            a.read_frame().data, "FIN", theirs.id, "client does not own message "
        )
        assert holder == me + 1
        internal = f"client does not own message {theirs.internal_id}"
        for what, send, reason in [
            ("REQ", lambda: req(a, theirs.id, 0), "client does not own message "),
            ("REQ", lambda: req(a, theirs.id, 1000), internal),
            ("TOUCH", lambda: touch(a, theirs.id), "client does not own message "),
        ]:
            send()
            assert owner_error(a.read_frame().data, what, theirs.id, reason) == (holder, me)
        req(a, mine.id, 60000)
        for what, send in [
            ("FIN", lambda: fin(a, mine.id)),
            ("REQ", lambda: req(a, mine.id, 0)),
            ("TOUCH", lambda: touch(a, mine.id)),
        ]:
            send()
            reason = "client does not own message "
            assert owner_error(a.read_frame().data, what, mine.id, reason) == (0, me)
        req(a, mine.id, 1000)
        a.expect_error(f"E_REQ_FAILED REQ {go_bytes(mine.id)} failed Message is deferred")
        fin(b, theirs.id)
        prove_open_subscribed(a)


# == the message a channel has read ahead ====================================================
#
# nsqd's channel pump (channel.go messagePump) reads the next message as soon as there is one
# and then waits on the unbuffered clientMsgChan until a consumer has RDY room.  A reset of the
# reader (setoffset, empty, a SUB_ADVANCED start) is handled inside that wait, and the pump
# then goes back to delivering the message it holds ("retry delivering msg to client,
# regardless reset result").  ``depth_ts_nano`` in ``/stats`` is the timestamp of the message
# the pump read from the log last (0 after a reset): the cases wait for it rather than sleep.


def channel_entry(backend: Backend, topic: str, channel: str) -> dict[str, Any]:
    """The channel's object in the leader's ``/stats`` (empty while it is not listed)."""
    entry = stats_partition(backend.leader_http(topic), topic, 0) or {}
    for item in entry.get("channels") or []:
        if item["channel_name"] == channel:
            return dict(item)
    return {}


def wait_read_ahead(backend: Backend, topic: str, channel: str, past: int = 0) -> int:
    """Wait until the channel's pump has read a message after the one stamped ``past``."""
    return int(
        wait_for(
            lambda: (
                channel_entry(backend, topic, channel).get("depth_ts_nano", 0) not in (0, past)
                and channel_entry(backend, topic, channel)["depth_ts_nano"]
            ),
            10.0,
            "the channel pump to read ahead",
            interval=0.05,
        )
    )


def created_channel(backend: Backend, topic: str, channel: str) -> dict[str, str]:
    params = {"topic": topic, "partition": "0", "channel": channel}
    resp = http("POST", f"{backend.leader_http(topic)}/channel/create", params)
    assert (resp.status_code, resp.text) == (200, "")
    return params


def test_setoffset_first_delivers_the_message_read_ahead(backend: Backend) -> None:
    """A channel with a backlog and no consumer has read its first message ahead; after
    ``/channel/setoffset`` to the third, that message still comes first, then the third on."""
    created_channel(backend, B_PLAIN, "c_ra_set")
    with Wire(backend.leader(B_PLAIN)) as p:
        offsets = [pub_trace(p, B_PLAIN, b"so-%d" % i, i + 1).offset for i in range(5)]
    wait_read_ahead(backend, B_PLAIN, "c_ra_set")
    resp = setoffset(backend, B_PLAIN, "c_ra_set", b"virtual_queue:%d" % offsets[2])
    assert (resp.status_code, resp.text) == (200, "")
    assert channel_entry(backend, B_PLAIN, "c_ra_set")["depth_ts_nano"] == 0
    spec = Sub(B_PLAIN, "c_ra_set", command="SUB_ADVANCED", rdy=10)
    with subscribe(backend.leader(B_PLAIN), spec) as sub:
        assert read_until(sub, b"so-4", detail=True) == [b"so-0", b"so-2", b"so-3", b"so-4"]


def test_channel_empty_keeps_the_message_read_ahead(backend: Backend) -> None:
    """``/channel/empty`` leaves depth 0, yet the message the pump holds is delivered."""
    params = created_channel(backend, B_PLAIN, "c_ra_empty")
    url = backend.leader_http(B_PLAIN)
    with Wire(backend.leader(B_PLAIN)) as p:
        for i in range(3):
            pub(p, B_PLAIN, b"em-%d" % i)
        wait_read_ahead(backend, B_PLAIN, "c_ra_empty")
        resp = http("POST", f"{url}/channel/empty", params)
        assert (resp.status_code, resp.text) == (200, "")
        entry = channel_entry(backend, B_PLAIN, "c_ra_empty")
        assert (entry["depth"], entry["depth_size"], entry["depth_ts_nano"]) == (0, 0, 0)
        spec = Sub(B_PLAIN, "c_ra_empty", command="SUB_ADVANCED", rdy=5)
        with subscribe(backend.leader(B_PLAIN), spec) as sub:
            pub(p, B_PLAIN, b"em-after")
            assert read_until(sub, b"em-after", detail=True) == [b"em-0", b"em-after"]


def test_sub_advanced_to_the_end_keeps_the_message_read_ahead(backend: Backend) -> None:
    """A first consumer's ``SUB_ADVANCED ... special:-1`` skips the backlog but the message
    already read ahead."""
    created_channel(backend, B_PLAIN, "c_ra_end")
    with Wire(backend.leader(B_PLAIN)) as p:
        for i in range(3):
            pub(p, B_PLAIN, b"se-%d" % i)
        wait_read_ahead(backend, B_PLAIN, "c_ra_end")
        with Wire(backend.leader(B_PLAIN)) as sub:
            sub.command(f"SUB_ADVANCED {B_PLAIN} c_ra_end 0 special:-1")
            sub.expect_ok()
            sub.command("RDY 5")
            pub(p, B_PLAIN, b"se-after")
            assert read_until(sub, b"se-after", detail=True) == [b"se-0", b"se-after"]
        entry = channel_entry(backend, B_PLAIN, "c_ra_end")
        assert entry["depth"] == 0


def test_setoffset_under_a_consumer_forgets_its_message_and_delivers_the_one_read_ahead(
    backend: Backend,
) -> None:
    """A consumer with RDY 1 holds the first message and the pump the second.  A setoffset to
    the fourth forgets the first (channel.go drainChannelWaiting/initPQ: its holder gets the
    RDY room back, its FIN is "not in flight") and delivers the second at once, then the
    fourth and the fifth."""
    spec = Sub(B_PLAIN, "c_ra_live", command="SUB_ADVANCED", rdy=1)
    with subscribe(backend.leader(B_PLAIN), spec) as sub:
        with Wire(backend.leader(B_PLAIN)) as p:
            offsets = [pub_trace(p, B_PLAIN, b"sl-%d" % i, i + 1).offset for i in range(5)]
        first = sub.read_message(detail=True)
        assert first.body == b"sl-0"
        wait_read_ahead(backend, B_PLAIN, "c_ra_live", past=first.timestamp)
        resp = setoffset(backend, B_PLAIN, "c_ra_live", b"virtual_queue:%d" % offsets[3])
        assert (resp.status_code, resp.text) == (200, "")
        held = sub.read_message(detail=True)
        assert (held.body, held.attempts) == (b"sl-1", 1)
        fin(sub, first.id)
        sub.expect_error(fin_failed(first.id))
        (client,) = channel_entry(backend, B_PLAIN, "c_ra_live")["clients"]
        assert (client["in_flight_count"], client["requeue_count"]) == (1, 1)
        fin(sub, held.id)
        assert read_until(sub, b"sl-4", detail=True) == [b"sl-3", b"sl-4"]


def test_a_seek_onto_the_message_read_ahead_delivers_it_once(backend: Backend) -> None:
    """The held first message and the new position's first message are the same: it is
    delivered once (protocol_v2.go messagePump skips a message already in flight or
    confirmed)."""
    created_channel(backend, B_PLAIN, "c_ra_onto")
    with Wire(backend.leader(B_PLAIN)) as p:
        offsets = [pub_trace(p, B_PLAIN, b"on-%d" % i, i + 1).offset for i in range(3)]
        wait_read_ahead(backend, B_PLAIN, "c_ra_onto")
        resp = setoffset(backend, B_PLAIN, "c_ra_onto", b"virtual_queue:%d" % offsets[0])
        assert (resp.status_code, resp.text) == (200, "")
        spec = Sub(B_PLAIN, "c_ra_onto", command="SUB_ADVANCED", rdy=10)
        with subscribe(backend.leader(B_PLAIN), spec) as sub:
            pub(p, B_PLAIN, b"on-after")
            assert read_until(sub, b"on-after", detail=True) == [
                b"on-0",
                b"on-1",
                b"on-2",
                b"on-after",
            ]


def test_a_requeued_message_can_be_the_one_read_ahead(backend: Backend) -> None:
    """A consumer leaves with three messages in flight; they are requeued and the pump takes
    one of them at once.  A new first consumer starting at the end (``special:-1``) still
    gets that one, with its attempts, and nothing else of the old three (which one is the
    pump's pick on the fork)."""
    spec = Sub(B_PLAIN, "c_ra_req", command="SUB_ADVANCED", rdy=5)
    with Wire(backend.leader(B_PLAIN)) as p:
        with subscribe(backend.leader(B_PLAIN), spec) as gone:
            for i in range(3):
                pub(p, B_PLAIN, b"rq-%d" % i)
            assert [gone.read_message(detail=True).body for _ in range(3)] == [
                b"rq-0",
                b"rq-1",
                b"rq-2",
            ]
        wait_for(
            lambda: channel_entry(backend, B_PLAIN, "c_ra_req").get("requeue_count") == 3,
            10.0,
            "the three messages requeued",
            interval=0.05,
        )
        with Wire(backend.leader(B_PLAIN)) as sub:
            sub.command(f"SUB_ADVANCED {B_PLAIN} c_ra_req 0 special:-1")
            sub.expect_ok()
            sub.command("RDY 5")
            pub(p, B_PLAIN, b"rq-after")
            got = []
            while not got or got[-1].body != b"rq-after":
                got.append(sub.read_message(detail=True))
                fin(sub, got[-1].id)
    assert len(got) == 2, [m.body for m in got]
    assert got[0].body in (b"rq-0", b"rq-1", b"rq-2")
    assert got[0].attempts == 1


def test_an_ordered_seek_delivers_the_held_message_then_the_next_one_twice(
    backend: Backend,
) -> None:
    """An ordered channel's pump holds its next message too, and delivers it after a seek.
    Its FIN makes nsqd reset the ordered reader once more (channel.go messagePump: "read a
    message not in ordered"), which forgets the message it has just sent from the new
    position and sends it again: two copies under one id, past RDY 1; one FIN finishes it."""
    spec = Sub(B_ORD, "c_ra_ord", command="SUB_ORDERED", rdy=0)
    with subscribe(backend.leader(B_ORD), spec) as sub:
        with Wire(backend.leader(B_ORD)) as p:
            offsets = [pub_trace(p, B_ORD, b"or-%d" % i, i + 1).offset for i in range(4)]
        wait_read_ahead(backend, B_ORD, "c_ra_ord")
        resp = setoffset(backend, B_ORD, "c_ra_ord", b"virtual_queue:%d" % offsets[2])
        assert (resp.status_code, resp.text) == (200, "")
        sub.command("RDY 1")
        held = sub.read_message(detail=True)
        assert (held.body, held.offset) == (b"or-0", offsets[0])
        fin(sub, held.id)
        one, two = sub.read_message(detail=True), sub.read_message(detail=True)
        assert (one.body, one.id, one.attempts) == (b"or-2", two.id, 1)
        assert (two.body, two.attempts, two.offset) == (b"or-2", 1, offsets[2])
        fin(sub, two.id)
        last = sub.read_message(detail=True)
        assert last.body == b"or-3"
        fin(sub, last.id)
        sub.expect_silence(0.5)
        fin(sub, one.id)
        sub.expect_error(fin_failed(one.id))


def test_identify_without_client_id_or_hostname_leaves_them_empty(backend: Backend) -> None:
    """client_v2.go Identify sets ``client_id`` (else ``short_id``) and ``hostname`` (else
    ``long_id``) even when empty: the remote address is their default only before IDENTIFY."""
    with Wire(backend.leader(B_PLAIN)) as w:
        w.identify_body({"user_agent": "ua/1"})
        w.expect_ok()
        w.command(f"SUB {B_PLAIN} c_ident_empty 0")
        w.expect_ok()
        (client,) = wait_for(
            lambda: channel_entry(backend, B_PLAIN, "c_ident_empty").get("clients"),
            10.0,
            "the client in /stats",
        )
    assert (client["client_id"], client["hostname"], client["user_agent"]) == ("", "", "ua/1")


def test_backlogs_count_what_is_deferred_and_what_the_pump_has_not_read(backend: Backend) -> None:
    """channel.go Backlogs (not ordered): messages deferred by a REQ with a delay plus those
    the pump has not read yet (it has read one ahead of what it delivered)."""
    created_channel(backend, B_PLAIN, "c_backlogs")
    with Wire(backend.leader(B_PLAIN)) as p:
        for i in range(4):
            pub(p, B_PLAIN, b"bl-%d" % i)
        wait_read_ahead(backend, B_PLAIN, "c_backlogs")
        assert channel_entry(backend, B_PLAIN, "c_backlogs")["backlogs"] == 3
        spec = Sub(B_PLAIN, "c_backlogs", rdy=2)
        with subscribe(backend.leader(B_PLAIN), spec) as sub:
            first, second = sub.read_message(), sub.read_message()
            fin(sub, first.id)
            req(sub, second.id, 60_000)

            def counted() -> dict[str, Any]:
                entry = channel_entry(backend, B_PLAIN, "c_backlogs")
                return entry if entry.get("deferred_count") == 1 else {}

            entry = wait_for(counted, 10.0, "the deferred message in /stats")
            # RDY 2 took the other two as well: nothing is left unread, one is deferred
            assert (entry["backlogs"], entry["depth"]) == (1, 3)


def test_channel_empty_leaves_depth_0_with_the_message_read_ahead_in_flight(
    backend: Backend,
) -> None:
    """After ``/channel/empty`` the pump's held message goes out, yet depth counts from the
    new confirmed position (the end): 0, with that message in flight."""
    params = created_channel(backend, B_PLAIN, "c_empty_held")
    url = backend.leader_http(B_PLAIN)
    with Wire(backend.leader(B_PLAIN)) as p:
        for i in range(3):
            pub(p, B_PLAIN, b"eh-%d" % i)
    spec = Sub(B_PLAIN, "c_empty_held", rdy=1)
    with subscribe(backend.leader(B_PLAIN), spec) as sub:
        first = sub.read_message()
        assert first.body == b"eh-0"
        wait_read_ahead(backend, B_PLAIN, "c_empty_held", past=first.timestamp)
        resp = http("POST", f"{url}/channel/empty", params)
        assert (resp.status_code, resp.text) == (200, "")
        held = sub.read_message()
        assert held.body == b"eh-1"
        entry = channel_entry(backend, B_PLAIN, "c_empty_held")
        assert (entry["depth"], entry["in_flight_count"], entry["backlogs"]) == (0, 1, 0)
        fin(sub, first.id)
        sub.expect_error(fin_failed(first.id))
        fin(sub, held.id)


def test_the_first_sub_ordered_on_a_channel_with_a_backlog_may_send_its_head_twice(
    backend: Backend,
) -> None:
    """SUB_ORDERED makes nsqd's SetOrdered reset the reader the first time: the head message
    the pump holds goes out, the reset forgets it and reads it again. The real fork sends it
    twice (same id, attempts 1) in most runs, once in others; the embedded cluster twice when
    the message is 0.1 s old or more (tests/unit/devcluster/test_store.py). Then the rest, one
    at a time, in order."""
    created_channel(backend, B_ORD, "c_first_ordered")
    with Wire(backend.leader(B_ORD)) as p:
        for i in range(3):
            pub(p, B_ORD, b"fo-%d" % i)
    wait_read_ahead(backend, B_ORD, "c_first_ordered")
    spec = Sub(B_ORD, "c_first_ordered", command="SUB_ORDERED", rdy=5)
    with subscribe(backend.leader(B_ORD), spec) as sub:
        head = sub.read_message(detail=True)
        copies = [head]
        with contextlib.suppress(NoFrame):
            copies.append(sub.read_message(detail=True, timeout=1.0))
        assert {(m.body, m.id, m.attempts, m.offset) for m in copies} == {
            (b"fo-0", head.id, 1, head.offset)
        }
        fin(sub, head.id)
        assert read_until(sub, b"fo-2", detail=True) == [b"fo-1", b"fo-2"]


def test_stats_list_each_tcp_publisher_until_it_disconnects(backend: Backend) -> None:
    """stats.go ClientPubStats: a TCP publisher of a topic partition is listed by its remote
    address, with the user agent it had at its first publish, ``tcp``, the messages it
    published (PUB counts 1, MPUB its count) and the time of its first publish; the topic's
    ``client_num`` counts the publishers; a publisher that disconnects is gone
    (nsqd.go CleanClientPubStats). HTTP publishers are not listed."""
    url = backend.http_url(backend.leader(B_TWO, 1))

    def publishers() -> list[dict[str, Any]]:
        return list((stats_partition(url, B_TWO, 1) or {}).get("client_pub_stats") or [])

    http("POST", f"{url}/pub", {"topic": B_TWO, "partition": "1"}, content=b"over http")
    with Wire(backend.leader(B_TWO, 1)) as p:
        p.identify_body({"user_agent": "pub/1"})
        p.expect_ok()
        for i in range(3):
            pub(p, B_TWO, b"ps-%d" % i, partition=1)
        p.command(f"MPUB {B_TWO} 1", mpub_body([b"ps-3", b"ps-4"]))
        p.expect_ok()
        host, port = p.sock.getsockname()[:2]
        (entry,) = wait_for(publishers, 10.0, "the publisher in /stats")
        assert isinstance(entry.pop("last_pub_ts"), int)
        assert entry == {
            "remote_address": f"{host}:{port}",
            "user_agent": "pub/1",
            "protocol": "tcp",
            "pub_count": 5,
            "err_count": 0,
        }
        assert (stats_partition(url, B_TWO, 1) or {})["client_num"] == 1
    wait_for(lambda: not publishers(), 10.0, "the publisher gone from /stats")


def test_a_req_over_15_minutes_goes_to_the_delayed_queue(backend: Backend) -> None:
    """protocol_v2.go REQ: a delay over ``--req-to-end-threshold`` (15 min) on a plain channel
    sends the message to the delayed queue (requeueToEnd): the original is finished, so it
    is neither in flight nor deferred and its FIN answers "not in flight"; the channel counts
    it in ``delayed_queue_count``; its holder counts a requeue and gets the RDY room back."""
    spec = Sub(B_PLAIN, "c_req_to_end", rdy=1)
    with subscribe(backend.leader(B_PLAIN), spec) as sub, Wire(backend.leader(B_PLAIN)) as p:
        pub(p, B_PLAIN, b"to-end")
        msg = sub.read_message()
        req(sub, msg.id, 16 * 60 * 1000)

        def moved() -> dict[str, Any]:
            entry = channel_entry(backend, B_PLAIN, "c_req_to_end")
            return entry if entry.get("delayed_queue_count") == 1 else {}

        entry = wait_for(moved, 10.0, "the message in the delayed queue")
        counters = ("depth", "backlogs", "in_flight_count", "deferred_count", "requeue_count")
        assert [entry[k] for k in counters] == [0, 0, 0, 0, 0]
        (client,) = entry["clients"]
        assert (client["in_flight_count"], client["requeue_count"], client["finish_count"]) == (
            0,
            1,
            0,
        )
        fin(sub, msg.id)
        sub.expect_error(fin_failed(msg.id))
        pub(p, B_PLAIN, b"after")
        assert read_until(sub, b"after") == [b"after"]
