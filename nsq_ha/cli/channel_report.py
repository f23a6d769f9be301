"""What a ``nsq-ha channel ACTION`` did on each partition (or, on vanilla, each nsqd).

A channel command goes to every partition's leader in turn. One that fails (its leader
unreachable, a refusal, no answer) does not stop the others: :class:`ChannelReport` records each
outcome (done; empty, for a seek into a partition that never had a message, which is already at
any position; failed; not tried, when ``--timeout`` ran out first), prints a line per partition
as it goes (or one JSON summary at the end), and when anything was not done ends the command
with one line listing what was done and what was not (exit 1).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from nsq_ha.admin.nsqd import PartitionEmptyError
from nsq_ha.errors import NsqError

from .where import CliError

__all__ = ["DONE", "ChannelReport", "Place"]

#: each action's past tense, for the printed lines
DONE = {
    "create": "created",
    "delete": "deleted",
    "pause": "paused",
    "unpause": "unpaused",
    "empty": "emptied",
    "seek": "moved",
    "setorder": "reordered",
}
_PRESENT = {"seek": "move", "setorder": "set the order of"}


class Place(Protocol):
    """Where one call goes: a partition (None on vanilla) and its nsqd's address."""

    @property
    def partition(self) -> int | None: ...

    @property
    def address(self) -> str: ...


@dataclass(slots=True)
class ChannelReport:
    """The outcome of one channel action on each of its places, in order."""

    action: str
    topic: str
    channel: str
    as_json: bool = False
    out: TextIO = field(default_factory=lambda: sys.stdout)
    places: list[Place] = field(default_factory=list)
    done: list[Place] = field(default_factory=list)
    empty: list[Place] = field(default_factory=list)
    failed: list[tuple[Place, str]] = field(default_factory=list)
    current: Place | None = None

    def _where(self, place: Place) -> str:
        part = "" if place.partition is None else f" partition {place.partition}"
        return f"{self.topic}/{self.channel}{part} on {place.address}"

    def _say(self, line: str) -> None:
        if not self.as_json:
            print(line, file=self.out, flush=True)

    async def run(self, place: Place, call: Awaitable[None]) -> None:
        """Await ``call`` for ``place`` and record how it went; an :class:`NsqError` is that
        place's failure, not the command's."""
        self.current = place
        try:
            await call
        except PartitionEmptyError:
            self.empty.append(place)
            self._say(f"{self._where(place)}: empty (no message yet), already at any position")
        except NsqError as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            self.failed.append((place, text))
            verb = _PRESENT.get(self.action, self.action)
            self._say(f"failed to {verb} {self._where(place)}: {text}")
        else:
            self.done.append(place)
            self._say(f"{DONE[self.action]} {self._where(place)}")
        self.current = None

    def out_of_time(self, limit: float) -> None:
        """``--timeout`` ran out: the place being done failed, the rest were not tried."""
        if self.current is not None:
            place, self.current = self.current, None
            text = f"no answer within {limit:g} s (--timeout {limit:g})"
            self.failed.append((place, text))
            verb = _PRESENT.get(self.action, self.action)
            self._say(f"failed to {verb} {self._where(place)}: {text}")
        for place in self.not_tried:
            self._say(f"not tried: {self._where(place)} (out of time)")

    @property
    def not_tried(self) -> list[Place]:
        """The places with no outcome."""
        seen = {id(p) for p in (*self.done, *self.empty, *(p for p, _ in self.failed))}
        return [p for p in self.places if id(p) not in seen]

    def summary(self, **extra: Any) -> dict[str, Any]:
        """The JSON ``--json`` prints."""

        def one(place: Place) -> dict[str, Any]:
            return {"partition": place.partition, "nsqd": place.address}

        return {
            "topic": self.topic,
            "channel": self.channel,
            "action": self.action,
            "done": [one(p) for p in self.done],
            "empty": [one(p) for p in self.empty],
            "failed": [{**one(p), "error": text} for p, text in self.failed],
            "not_tried": [one(p) for p in self.not_tried],
            **extra,
        }

    def finish(self, **extra: Any) -> None:
        """Print the JSON summary (``--json``); then, when a place was not done, end the
        command with one line saying what was and what was not (:class:`CliError`, exit 1)."""
        if self.as_json:
            print(json.dumps(self.summary(**extra), sort_keys=True), file=self.out, flush=True)
        missed = self.not_tried
        if not self.failed and not missed:
            return
        word = DONE[self.action]
        done = _labels(self.done) or "none"
        if self.empty:
            done += f" ({_labels(self.empty)} empty: already at any position)"
        not_done = [f"{_label(p)} (failed: see above)" for p, _ in self.failed]
        not_done += [f"{_label(p)} (not tried: out of time, raise --timeout)" for p in missed]
        raise CliError(
            f"{self.topic}/{self.channel}: {word}: {done}; not {word}: {', '.join(not_done)}", 1
        )


def _label(place: Place) -> str:
    return place.address if place.partition is None else str(place.partition)


def _labels(places: list[Place]) -> str:
    return ", ".join(_label(p) for p in places)
