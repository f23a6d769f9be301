"""Consumer parts that need no server: backoff strategies, Message views, argument checks."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from nsq_ha.consumer import Consumer, Exponential, Fixed, Message, Outcome
from nsq_ha.consumer.message import answer_hook, set_answer_hook
from nsq_ha.errors import ConfigError, InvalidNameError, MessageAlreadyRespondedError
from nsq_ha.protocol.message import DecodedMessage


def test_exponential_backoff_doubles_up_to_its_maximum() -> None:
    strategy = Exponential(base=0.5, maximum=3.0)
    assert [strategy.delay(level) for level in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert Exponential().delay(1000) == 120.0  # no overflow at absurd levels
    spread = Exponential(base=1.0, jitter=0.5)
    assert all(0.5 <= spread.delay(1) <= 1.5 for _ in range(50))
    assert Fixed(0.25).delay(7) == 0.25


@pytest.mark.parametrize(
    "make",
    [
        lambda: Exponential(base=0),
        lambda: Exponential(maximum=-1),
        lambda: Exponential(jitter=1.0),
        lambda: Fixed(-0.1),
        lambda: Fixed(float("nan")),
    ],
)
def test_bad_backoff_values_are_refused(make: object) -> None:
    with pytest.raises(ConfigError):
        make()  # type: ignore[operator]


@dataclass
class Owner:
    topic: str = "t"
    channel: str = "c"
    partition: int | None = 3
    address: str = "127.0.0.1:4150"
    ordered: bool = True

    def __post_init__(self) -> None:
        self.calls: list[str] = []

    def finish(self, message: Message) -> None:
        self.calls.append("fin")
        message.outcome = Outcome.FINISHED

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        self.calls.append(f"req {delay} {backoff}")
        message.outcome = Outcome.REQUEUED

    def touch(self, message: Message) -> None:
        self.calls.append("touch")


def decoded(**extra: object) -> DecodedMessage:
    fields: dict[str, object] = {
        "timestamp": 1,
        "attempts": 2,
        "id": b"\x00" * 7 + b"\x05" + b"\x00" * 7 + b"\x09",
        "body": b"hello",
        "internal_id": 5,
        "trace_id": 9,
        "offset": 70,
        "raw_size": 35,
    }
    fields.update(extra)
    return DecodedMessage(**fields)  # type: ignore[arg-type]


async def test_message_shows_what_was_delivered_and_answers_once() -> None:
    owner = Owner()
    message = Message(decoded(), owner)
    assert (message.body, message.internal_id, message.trace_id) == (b"hello", 5, 9)
    assert (message.partition, message.offset, message.raw_size, message.attempts) == (3, 70, 35, 2)
    assert message.ordered
    assert message.ext == {}
    assert message.tag is None
    assert "t/3" in repr(message)
    assert "offset=70" in repr(message)
    await message.touch()
    await message.finish()
    assert message.responded
    with pytest.raises(MessageAlreadyRespondedError, match="finished"):
        await message.requeue()
    with pytest.raises(MessageAlreadyRespondedError):
        await message.touch()
    assert owner.calls == ["touch", "fin"]


async def test_requeue_passes_delay_and_backoff_to_the_consumer() -> None:
    owner = Owner()
    message = Message(decoded(), owner)
    await message.requeue(2.5, backoff=False)
    assert owner.calls == ["req 2.5 False"]
    assert message.outcome is Outcome.REQUEUED


@pytest.mark.parametrize("delay", [-1, float("nan"), True, "5"])
async def test_a_bad_requeue_delay_raises_config_error_and_changes_nothing(delay: object) -> None:
    """Also compiled: the delay is checked by the message, not by a parameter's type."""
    owner = Owner()
    message = Message(decoded(), owner)
    with pytest.raises(ConfigError, match="requeue delay"):
        await message.requeue(delay)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="requeue delay"):
        message.requeue_nowait(delay)  # type: ignore[arg-type]
    assert owner.calls == []
    assert not message.responded


@pytest.mark.parametrize("backoff", [1, "no", None])
async def test_a_requeue_backoff_that_is_not_a_bool_raises_config_error(backoff: object) -> None:
    """The same typed error on both paths (compiled, a ``bool`` parameter would raise mypyc's
    TypeError; pure Python would take any value's truth), before anything changes."""
    owner = Owner()
    message = Message(decoded(), owner)
    with pytest.raises(ConfigError, match="backoff must be True or False"):
        await message.requeue(1.0, backoff=backoff)
    with pytest.raises(ConfigError, match="backoff must be True or False"):
        message.requeue_nowait(backoff=backoff)
    assert owner.calls == []
    assert not message.responded


async def test_the_answer_hook_runs_around_every_answer_and_can_be_removed() -> None:
    """The seam OpenTelemetry uses (a compiled Message's methods cannot be replaced): the hook
    gets the message, the action and the answer to run, also from finish() and requeue()."""
    seen: list[tuple[Message, str]] = []

    def hook(message: Message, action: str, answer: Callable[[], None]) -> None:
        seen.append((message, action))
        answer()

    owner = Owner()
    first, second, third = (Message(decoded(), owner) for _ in range(3))
    assert set_answer_hook(hook) is None
    try:
        assert answer_hook() is hook
        await first.finish()
        second.requeue_nowait(1.5, backoff=False)
        with pytest.raises(ConfigError):  # raised by the answer, inside the hook
            await third.requeue(-1)
    finally:
        assert set_answer_hook(None) is hook
    assert seen == [(first, "finish"), (second, "requeue"), (third, "requeue")]
    assert owner.calls == ["fin", "req 1.5 False"]
    await third.finish()  # no hook: answered directly
    assert len(seen) == 3
    assert owner.calls[-1] == "fin"


def test_ext_header_and_tags() -> None:
    header = json.dumps({"##client_dispatch_tag": "blue", "k": 1}).encode()
    message = Message(decoded(ext_version=4, ext_data=header), Owner())
    assert message.ext == {"##client_dispatch_tag": "blue", "k": 1}
    assert message.tag == "blue"
    legacy = Message(decoded(ext_version=2, ext_data=b"red"), Owner())
    assert legacy.tag == "red"
    assert legacy.ext == {}
    broken = Message(decoded(ext_version=4, ext_data=b"{not json"), Owner())
    assert broken.tag is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({}, ConfigError),  # no lookupd/lookup/nsqd
        ({"nsqd": "a:1", "lookupd": "http://b:2"}, ConfigError),
        ({"nsqd": []}, ConfigError),
        ({"nsqd": "a:1", "ordered": True, "sample_rate": 10}, ConfigError),
        ({"nsqd": "a:1", "member": (3, 3)}, ConfigError),
        ({"lookupd": "http://b:2", "member": (3, 3)}, ConfigError),
        ({"lookupd": "http://b:2", "member": "0/3"}, ConfigError),
        ({"nsqd": "a:1", "partitions": [-1]}, ConfigError),
        ({"nsqd": "a:1", "max_attempts": -1}, ConfigError),
        ({"nsqd": "a:1", "max_in_flight": -5}, ConfigError),
        ({"nsqd": "a:1", "backoff": 3}, ConfigError),
        ({"nsqd": "a:1", "drain_timeout": 0}, ConfigError),
        ({"nsqd": "a:1", "requeue_delay": -1}, ConfigError),
    ],
)
def test_bad_consumer_arguments_are_refused_before_any_io(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        Consumer("topic", "channel", **kwargs)  # type: ignore[arg-type]


def test_bad_names_are_refused() -> None:
    with pytest.raises(InvalidNameError):
        Consumer("bad topic!", "c", nsqd="a:1")
    with pytest.raises(InvalidNameError):
        Consumer("t", "", nsqd="a:1")
