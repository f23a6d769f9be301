"""LookupdAdmin's defaults: each is written once (no server)."""

from __future__ import annotations

import inspect

from nsq_ha.admin import LookupdAdmin, NsqdAdmin
from nsq_ha.admin.lookupd import (
    CREATE_TOPIC_TIMEOUT,
    EXPAND_TOPIC_TIMEOUT,
    MOVE_LEADER_TIMEOUT,
    WAIT_STABLE_TIMEOUT,
)
from nsq_ha.lookup.http import ADMIN_TIMEOUT


def _defaults(function: object) -> dict[str, object]:
    parameters = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def test_create_topic_leaves_the_topics_options_to_topic_spec() -> None:
    defaults = _defaults(LookupdAdmin.create_topic)
    for name in ("partitions", "replicas", "ordered", "ext", "multi_part", "channel_auto_create"):
        assert defaults[name] is None, name


def test_the_waiting_calls_deadlines_are_the_named_constants() -> None:
    assert _defaults(LookupdAdmin.create_topic)["timeout"] == CREATE_TOPIC_TIMEOUT
    assert _defaults(LookupdAdmin.expand_topic)["timeout"] == EXPAND_TOPIC_TIMEOUT
    assert _defaults(LookupdAdmin.move_leader)["timeout"] == MOVE_LEADER_TIMEOUT
    assert _defaults(LookupdAdmin.wait_stable)["timeout"] == WAIT_STABLE_TIMEOUT


def test_both_admin_clients_and_a_consumers_seek_share_one_call_deadline() -> None:
    from nsq_ha.consumer import positions

    assert _defaults(LookupdAdmin)["timeout"] == ADMIN_TIMEOUT
    assert _defaults(NsqdAdmin)["timeout"] == ADMIN_TIMEOUT
    assert positions.ADMIN_TIMEOUT == ADMIN_TIMEOUT
