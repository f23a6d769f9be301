"""``nsq-ha topic create`` leaves what is not given to the library: the topic it asks for is
:class:`~nsq_ha.admin.TopicSpec`'s defaults plus the options given (no server: the admin client
is a stand-in that records the call)."""

from __future__ import annotations

from types import TracebackType
from typing import Any, ClassVar

import pytest

from nsq_ha.admin import TopicSpec
from nsq_ha.cli import commands, main


class RecordingAdmin:
    """Stands in for ``LookupdAdmin``: records each ``create_topic`` call."""

    calls: ClassVar[list[tuple[tuple[Any, ...], dict[str, Any]]]] = []

    def __init__(self, seeds: list[str], *, timeout: float) -> None:
        self.timeout = timeout

    async def __aenter__(self) -> RecordingAdmin:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    async def create_topic(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    for name in ("NSQ_HA_LOOKUPD", "NSQ_HA_NSQD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(commands, "LookupdAdmin", RecordingAdmin)
    RecordingAdmin.calls = []
    return RecordingAdmin.calls


def asked_for(argv: list[str], recorded: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> TopicSpec:
    """The spec ``nsq-ha topic create ARGV`` asks for, as ``create_topic`` builds it."""
    assert main(["topic", "create", *argv, "--lookupd", "http://l:4161", "--no-wait"]) == 0
    ((args, kwargs),) = recorded
    options = {k: v for k, v in kwargs.items() if k not in ("wait", "timeout")}
    return TopicSpec.with_durability(*args, **options)


def test_topic_create_without_options_asks_for_the_librarys_defaults(
    recorded: list[tuple[tuple[Any, ...], dict[str, Any]]],
) -> None:
    assert asked_for(["t"], recorded) == TopicSpec("t")


def test_topic_create_passes_on_the_options_given(
    recorded: list[tuple[tuple[Any, ...], dict[str, Any]]],
) -> None:
    argv = ["t", "--partitions", "4", "--replicas", "2", "--ordered", "--no-channel-auto-create"]
    spec = asked_for(argv, recorded)
    assert spec == TopicSpec("t", 4, 2, ordered=True, channel_auto_create=False)
