"""``NsqdAdmin.stats``: what it asks nsqd for, and an answer too large is refused."""

from __future__ import annotations

import json

import httpx
import pytest

from nsq_ha.admin import AdminError, NsqdAdmin
from nsq_ha.admin import nsqd as admin_nsqd

ENTRY = {"topic_name": "t", "topic_partition": "0", "channels": []}


def transport(body: bytes, seen: list[httpx.Request]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200, stream=httpx.ByteStream(body), headers={"Content-Type": "application/json"}
        )

    return httpx.MockTransport(answer)


async def test_stats_asks_for_one_channel_without_clients() -> None:
    seen: list[httpx.Request] = []
    body = json.dumps({"topics": [ENTRY]}).encode()
    async with httpx.AsyncClient(transport=transport(body, seen)) as http:
        admin = NsqdAdmin("http://n:4151", http=http)
        assert await admin.stats("t", 0, channel="c", clients=False) == [ENTRY]
        assert await admin.stats() == [ENTRY]
    first, second = (dict(r.url.params) for r in seen)
    assert first == {
        "format": "json",
        "topic": "t",
        "partition": "0",
        "channel": "c",
        "needClients": "false",
        "include_clients": "false",
    }
    assert second == {"format": "json"}


async def test_stats_refuses_an_answer_over_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []
    body = json.dumps({"topics": [ENTRY] * 50}).encode()
    monkeypatch.setattr(admin_nsqd, "MAX_STATS_BYTES", len(body) - 1)
    async with httpx.AsyncClient(transport=transport(body, seen)) as http:
        admin = NsqdAdmin("http://n:4151", http=http)
        with pytest.raises(AdminError, match="answered more than"):
            await admin.stats("t")
    monkeypatch.setattr(admin_nsqd, "MAX_STATS_BYTES", len(body))
    async with httpx.AsyncClient(transport=transport(body, seen)) as http:
        assert len(await NsqdAdmin("http://n:4151", http=http).stats("t")) == 50
