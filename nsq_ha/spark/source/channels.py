"""The channels a range read makes, and the sweeper that deletes those a killed task left.

A replayable or batch read reads each range through a channel of its own, made on the
partition's leader and deleted when the read ends. A task that is killed (its executor lost,
its Python worker ended by a signal) cannot delete it, and on the fork a channel left behind
pins the partition's retention and shows as a lagging consumer. So the name of every such
channel says what it is and when it was made, ``<base>_<partition>_nsqr<created><random>``,
and the driver sweeps: a range channel made more than ``staleChannelTimeout`` seconds ago
that has no consumer connected is deleted. A live read always has its consumer connected
except while it reconnects, so a channel is deleted only when two sweeps at least
:data:`CONFIRM_AFTER` seconds apart (or ``staleChannelTimeout``, if shorter) both found it
idle. Sweeping costs one ``/stats`` request per node holding a leader, at most once per
confirmation interval per topic and driver process, and never fails a query (a failed sweep
is logged and tried again later). A source reading several topics sweeps each of them
(:meth:`ChannelSweeper.maybe_sweep_topics`, the topics due swept at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ...admin import NsqdAdmin
from ...errors import NsqError
from ...lookup.http import ADMIN_TIMEOUT, tls_context
from .extents import _leaders, _run

__all__ = ["CONFIRM_AFTER", "ChannelSweeper", "range_channel", "range_channel_created"]

log = logging.getLogger("nsq_ha.spark")

#: seconds between the two sweeps that must both find a range channel idle before it goes
CONFIRM_AFTER = 60.0
_MARK = "_nsqr"
_RANGE = re.compile(r"_(\d+)" + _MARK + r"([0-9a-f]{8})[0-9a-f]{6}$")


def range_channel(base: str, partition: int, now: float | None = None) -> str:
    """A fresh channel name for one read of ``partition``: ``base`` (cut to fit nsqd's 64
    characters), the partition, the mark, the creation time (Unix seconds, 8 hex digits) and
    6 random hex digits."""
    created = int(time.time() if now is None else now)
    suffix = f"_{partition}{_MARK}{created:08x}{secrets.token_hex(3)}"
    return base[: 64 - len(suffix)] + suffix


def range_channel_created(name: str) -> float | None:
    """When a range channel was made (Unix seconds), or None if ``name`` is not one."""
    found = _RANGE.search(name)
    return None if found is None else float(int(found.group(2), 16))


@dataclass(slots=True)
class _TopicState:
    last_sweep: float = float("-inf")
    #: (partition, channel) -> when a sweep first found it idle and old enough
    idle: dict[tuple[int, str], float] = field(default_factory=dict)


def _state_dir() -> Path:
    """Where the driver's processes share what their sweeps found (see :class:`ChannelSweeper`)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"nsq_ha-sweeps-{uid}"


class ChannelSweeper:
    """Deletes the range channels a killed task left behind (see the module's docstring).

    One instance per driver process (:data:`SWEEPER`) so that the readers of one topic share
    what they found; ``maybe_sweep`` is cheap when a sweep is not due.

    Spark plans a read in a Python worker of the driver, and the next plan may run in another
    worker process; so what a sweep found (when each idle channel was first seen, when the
    topic was last swept) is also kept in a small JSON file per topic under ``state_dir``
    (default: ``nsq_ha-sweeps-<uid>`` in the temp directory), read and replaced whole at each
    sweep. Two processes sweeping at once may lose one's notes: a channel then goes one sweep
    later, never sooner.
    """

    def __init__(self, state_dir: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._topics: dict[tuple[tuple[str, ...], str], _TopicState] = {}
        self._dir = state_dir

    def due(self, lookupd: Sequence[str], topic: str, timeout: float, now: float) -> bool:
        """Whether a sweep of ``topic`` is due (and if so, mark it started)."""
        with self._lock:
            state = self._state(lookupd, topic)
            if now - state.last_sweep < min(CONFIRM_AFTER, timeout):
                return False
            state.last_sweep = now
            return True

    def _state(self, lookupd: Sequence[str], topic: str) -> _TopicState:
        """The topic's state: this process's, merged with what the shared file says."""
        state = self._topics.setdefault((tuple(lookupd), topic), _TopicState())
        shared = self._load(lookupd, topic)
        if shared is not None:
            state.last_sweep = max(state.last_sweep, shared.last_sweep)
            for key, first in shared.idle.items():
                state.idle[key] = min(first, state.idle.get(key, first))
        return state

    def _file(self, lookupd: Sequence[str], topic: str) -> Path:
        digest = hashlib.sha256(json.dumps([list(lookupd), topic]).encode()).hexdigest()[:24]
        return (self._dir or _state_dir()) / f"{digest}.json"

    def _load(self, lookupd: Sequence[str], topic: str) -> _TopicState | None:
        path = self._file(lookupd, topic)
        try:
            if hasattr(os, "getuid") and path.parent.stat().st_uid != os.getuid():
                return None  # not our directory (another user made it): not trusted
            data: Any = json.loads(path.read_text())
            return _TopicState(
                float(data["last_sweep"]),
                {(int(p), str(name)): float(first) for p, name, first in data["idle"]},
            )
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: ours only
            return None

    def _save(self, lookupd: Sequence[str], topic: str, state: _TopicState) -> None:
        path = self._file(lookupd, topic)
        data = {
            "last_sweep": state.last_sweep,
            "idle": [[p, name, first] for (p, name), first in state.idle.items()],
        }
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data))
            tmp.replace(path)
        except OSError as exc:  # this process still remembers; only other processes lose it
            log.debug("could not save the sweep state of %r in %s: %s", topic, path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()

    async def sweep(
        self, lookupd: Sequence[str], topic: str, stale_after: float, now: float | None = None
    ) -> list[tuple[int, str]]:
        """One sweep of ``topic``: note the idle range channels older than ``stale_after`` s and
        delete those a sweep at least ``min(CONFIRM_AFTER, stale_after)`` s ago found idle too.
        Returns the deleted ``(partition, channel)``; raises NsqError when nsqd or lookupd
        cannot be asked (nothing is deleted then)."""
        now = time.time() if now is None else now
        _, leaders = await _leaders(lookupd, topic)
        by_node: dict[str, list[int]] = {}
        for partition, node in leaders.items():
            by_node.setdefault(node.http_url, []).append(partition)
        idle: dict[tuple[int, str], str] = {}
        async with httpx.AsyncClient(timeout=ADMIN_TIMEOUT, verify=tls_context()) as http:
            for url, partitions in by_node.items():
                for entry in await NsqdAdmin(url, http=http).topic_stats(topic):
                    partition = _partition(entry)
                    if entry.get("topic_name") != topic or partition not in partitions:
                        continue
                    for channel in entry.get("channels") or ():
                        name = channel.get("channel_name")
                        created = range_channel_created(name) if isinstance(name, str) else None
                        connected = channel.get("client_num") or channel.get("clients")
                        if created is not None and now - created > stale_after and not connected:
                            idle[(partition, str(name))] = url
            confirm = min(CONFIRM_AFTER, stale_after)
            with self._lock:
                state = self._state(lookupd, topic)
                seen = state.idle
                state.idle = {key: seen.get(key, now) for key in idle}
                doomed = [key for key in idle if now - seen.get(key, now) >= confirm]
                self._save(lookupd, topic, state)
            deleted = []
            for partition, name in doomed:
                try:
                    await NsqdAdmin(idle[(partition, name)], http=http).delete_channel(
                        topic, name, partition
                    )
                except NsqError as exc:
                    log.warning("could not delete %s/%d %s: %s", topic, partition, name, exc)
                    continue
                deleted.append((partition, name))
                log.info(
                    "deleted %s/%d channel %s: a range read left it (made %.0f s ago, no "
                    "consumer at two sweeps)",
                    topic,
                    partition,
                    name,
                    now - (range_channel_created(name) or now),
                )
        with self._lock:
            for key in deleted:
                state.idle.pop(key, None)
            if deleted:
                self._save(lookupd, topic, state)
        return deleted

    def maybe_sweep(self, lookupd: Sequence[str], topic: str, timeout: float) -> None:
        """Sweep ``topic`` from the driver if a sweep is due; never raises (logs instead)."""
        if not lookupd or not self.due(lookupd, topic, timeout, time.time()):
            return
        try:
            _run(self.sweep(lookupd, topic, timeout), 60.0)
        except (NsqError, TimeoutError) as exc:
            log.warning("sweeping the read channels of %r failed (tried later): %s", topic, exc)

    def maybe_sweep_topics(
        self, lookupd: Sequence[str], topics: Iterable[str], timeout: float
    ) -> None:
        """:meth:`maybe_sweep` for each of ``topics``, those due at once (16 at a time); never
        raises for a failed sweep (logs instead)."""
        if not lookupd:
            return
        now = time.time()
        due = [t for t in dict.fromkeys(topics) if self.due(lookupd, t, timeout, now)]
        if not due:
            return
        gate = asyncio.Semaphore(16)

        async def one(topic: str) -> None:
            async with gate:
                try:
                    await asyncio.wait_for(self.sweep(lookupd, topic, timeout), 60.0)
                except (NsqError, TimeoutError) as exc:
                    log.warning(
                        "sweeping the read channels of %r failed (tried later): %s", topic, exc
                    )

        async def every() -> None:
            await asyncio.gather(*(one(t) for t in due))

        try:
            _run(every(), 70.0 + 60.0 * (len(due) // 16))
        except TimeoutError as exc:
            log.warning("sweeping the read channels of %d topics timed out: %r", len(due), exc)


def _partition(entry: dict[str, object]) -> int:
    """The partition of a ``/stats`` topic entry (-1 when it has none)."""
    raw = entry.get("topic_partition")
    try:
        return int(str(raw))
    except ValueError:
        return -1


#: the driver process's sweeper
SWEEPER = ChannelSweeper()
