"""``LookupdAdmin.expand_topic`` on the embedded broker and the real fork: it returns once every
partition is writable; what it cannot do is refused with a typed error, bad input before
anything is sent."""

from __future__ import annotations

import secrets
import time

import pytest

from nsq_ha.admin import AdminError, LookupdAdmin, PartitionsNotReducibleError
from nsq_ha.errors import ConfigError, UnsupportedByServerError
from nsq_ha.testing.servers import VanillaCluster

from .backend import Backend


async def test_an_expansion_returns_once_every_partition_is_writable(backend: Backend) -> None:
    name = f"admin_expand_{secrets.token_hex(3)}"
    async with LookupdAdmin(backend.lookupd_http, timeout=60) as admin:
        await admin.create_topic(name, 2, multi_part=True, timeout=120)
        backend.wait_stable()
        started = time.monotonic()
        grown = await admin.expand_topic(name, 3, timeout=120)
        took = time.monotonic() - started
        assert grown is not None
        assert sorted(grown.partitions) == [0, 1, 2]
        assert grown.meta is not None
        assert grown.meta.partition_num == 3
        # the count it has already: nothing to do, the same map
        again = await admin.expand_topic(name, 3, timeout=30)
        assert again is not None
        assert sorted(again.partitions) == [0, 1, 2]
    print(f"{backend.name}: 2 -> 3 partitions, writable after {took:.1f} s")


async def test_fewer_partitions_are_refused_before_anything_is_sent(backend: Backend) -> None:
    name = f"admin_shrink_{secrets.token_hex(3)}"
    async with LookupdAdmin(backend.lookupd_http, timeout=60) as admin:
        await admin.create_topic(name, 2, multi_part=True, timeout=120)
        with pytest.raises(PartitionsNotReducibleError) as caught:
            await admin.expand_topic(name, 1)
        assert f"topic {name!r} has 2 partitions" in str(caught.value)
        assert "ask for 2 or more" in str(caught.value)
        with pytest.raises(AdminError, match="create it first"):
            await admin.expand_topic(f"admin_unknown_{secrets.token_hex(3)}", 3)


@pytest.mark.parametrize(
    ("partitions", "message"),
    [
        (0, "partitions must be between 1 and 254, got 0"),
        (255, "partitions must be between 1 and 254, got 255"),
        ("3", "partitions must be an int, not str"),
        (True, "partitions must be an int, not bool"),
    ],
)
async def test_bad_counts_are_refused_before_anything_is_sent(
    partitions: object, message: str
) -> None:
    # nothing listens there: a request would fail as unreachable, not as a ConfigError
    async with LookupdAdmin("http://127.0.0.1:9", timeout=5) as admin:
        with pytest.raises(ConfigError, match=message):
            await admin.expand_topic("t", partitions)  # type: ignore[arg-type]


@pytest.mark.vanilla
async def test_vanilla_has_no_partitions_to_add(vanilla_cluster: VanillaCluster) -> None:
    async with LookupdAdmin(vanilla_cluster.lookupd_http, timeout=10) as admin:
        with pytest.raises(UnsupportedByServerError, match="add nsqd nodes instead"):
            await admin.expand_topic("anything", 3)
