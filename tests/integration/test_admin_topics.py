"""``LookupdAdmin.create_topic`` of a topic that exists with other parameters, on the embedded
cluster and the real fork: nsqlookupd answers only ``already exist``; the error names what
exists."""

from __future__ import annotations

import secrets

import pytest

from nsq_ha.admin import AdminError, LookupdAdmin
from nsq_ha.admin.exists import TopicExistsError

from .backend import Backend


async def test_a_create_with_other_parameters_raises_what_exists(backend: Backend) -> None:
    name = f"admin_exists_{secrets.token_hex(3)}"
    async with LookupdAdmin(backend.lookupd_http, timeout=60) as admin:
        await admin.create_topic(name, 2, 2, ordered=True, timeout=120)
        again = await admin.create_topic(name, 2, 2, ordered=True, timeout=120)
        assert again is not None
        assert sorted(again.partitions) == [0, 1]  # the same parameters: accepted
        with pytest.raises(TopicExistsError) as caught:
            await admin.create_topic(name, 3, 1, ordered=True, ext=True, timeout=60)
    found = caught.value
    assert isinstance(found, AdminError)
    assert (found.topic, found.partitions, found.replicas) == (name, 2, 2)
    assert (found.ordered, found.ext) == (True, False)
    assert f"topic {name!r} already exists with 2 partitions and 2 replicas (ordered)" in str(found)
