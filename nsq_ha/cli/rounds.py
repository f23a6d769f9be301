"""The publishing half of ``nsq-ha pub``: records published in rounds through the producer,
each record with its own verdict, none published twice.

A round is one ``publish_many`` per sharding key (keys concurrently). A publish refused as a
whole (the client's checks before sending, or nsqd's ``E_BAD_MESSAGE``/``E_BAD_BODY``: nsqd
checks every message of an ``MPUB`` before it stores any) stored nothing, but does not say which
record it refused: its records are then sent again one at a time, so each gets its own verdict.
Other failures (a timeout, a lost connection) are reported, never retried here: nsqd may have
stored the message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nsq_ha.errors import BadBodyError, BadMessageError, ConfigError, NsqError, PublishError
from nsq_ha.producer import Producer, PublishResult

__all__ = [
    "NOT_SENT",
    "REFUSALS",
    "Outcome",
    "Record",
    "Rounds",
    "Tally",
    "result_json",
    "summary_line",
]


@dataclass(slots=True)
class Record:
    """One record read, numbered from 1 across every input."""

    number: int
    key: str | None
    body: bytes
    trace_id: int | None


#: errors that say a publish was refused as a whole, nothing of it stored: the client's checks
#: before sending, and nsqd's refusal of a message's size or format (it checks every message
#: of an MPUB before it stores any)
REFUSALS = (ConfigError, BadMessageError, BadBodyError)
NOT_SENT = "not sent: interrupted (Ctrl-C) before it was handed to the producer"


@dataclass(slots=True)
class Tally:
    """The summary being counted; each failure also printed as a JSON line with ``--json``."""

    summary: dict[str, Any]
    errors: Counter[str]
    per_partition: Counter[str]

    def failed(self, number: int | None, key: str | None, error: object, as_json: bool) -> None:
        """Count record ``number``'s failure (``error``), and print it with ``--json``."""
        self.summary["failed"] += 1
        self.errors[str(error)] += 1
        if as_json:
            line: dict[str, Any] = {"ok": False, "error": str(error)}
            if number is not None:
                line = {"line": number, "ok": False, "key": key, "error": str(error)}
            print(json.dumps(line), flush=True)

    def final(self, *, interrupted: bool) -> dict[str, Any]:
        """The summary at the end: counts, per-partition counts, the ten commonest errors,
        ``interrupted`` after Ctrl-C (the JSON summary, and what :func:`summary_line` says)."""
        summary = dict(self.summary)
        summary["partitions"] = dict(sorted(self.per_partition.items()))
        summary["errors"] = [{"error": e, "count": n} for e, n in self.errors.most_common(10)]
        if interrupted:
            summary["interrupted"] = True
        return summary


#: the distinct errors the one-line summary names (the JSON summary has up to ten), and how
#: much of each it shows
_LINE_ERRORS = 3
_LINE_ERROR_CHARS = 160


def _partition_order(item: tuple[str, int]) -> tuple[int, str]:
    name = item[0]
    return (int(name), "") if name.isdigit() else (-1, name)


def _short(error: object) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= _LINE_ERROR_CHARS else text[: _LINE_ERROR_CHARS - 3] + "..."


def summary_line(summary: Mapping[str, Any]) -> str:
    """The summary of :meth:`Tally.final` as one line for a person, e.g. ``published 5 of 6 to
    orders (partitions 0:2 1:3), 1 failed: E_BAD_MESSAGE ... (x1)``: partitions in numeric
    order (none for a topic without partitions), the commonest errors, each with its count."""
    published, failed = int(summary["published"]), int(summary["failed"])
    line = f"published {published} of {published + failed} to {summary['topic']}"
    partitions = sorted(dict(summary.get("partitions") or {}).items(), key=_partition_order)
    if any(name != "-" for name, _ in partitions):
        line += " (partitions " + " ".join(f"{name}:{n}" for name, n in partitions) + ")"
    if failed:
        errors = list(summary.get("errors") or [])[:_LINE_ERRORS]
        named = [f"{_short(e['error'])} (x{e['count']})" for e in errors]
        others = failed - sum(int(e["count"]) for e in errors)
        if others > 0:
            named.append(f"{others} more (--json shows each record)")
        line += f", {failed} failed: " + "; ".join(named)
    return line


def result_json(record: Record, result: PublishResult) -> dict[str, Any]:
    """The ``--json`` line of a published record."""
    message_id = result.message_id
    return {
        "line": record.number,
        "ok": True,
        "key": record.key,
        "partition": result.partition,
        "offset": result.offset,
        "id": message_id.hex() if message_id else None,
        "trace_id": result.trace_id,
        "attempts": result.attempts,
        "nsqd": result.address,
    }


Outcome = PublishResult | BaseException


class Rounds:
    """The records read but not yet published (:attr:`batch`), and the publishing of them in
    rounds: each record gets its own verdict, and none is published twice."""

    def __init__(
        self,
        producer: Producer,
        topic: str,
        ext: dict[str, Any] | None,
        args: argparse.Namespace,
        tally: Tally,
        stop: asyncio.Event,
    ) -> None:
        self.batch: list[Record] = []
        self._producer = producer
        self._topic = topic
        self._ext = ext
        self._args = args
        self._tally = tally
        self._stop = stop

    def __repr__(self) -> str:
        return f"<Rounds topic={self._topic!r} held={len(self.batch)}>"

    async def flush(self) -> None:
        """Publish the batch (a round), then report every record of it in order."""
        if not self.batch:
            return
        batch, self.batch = self.batch, []
        outcomes = await self._publish(batch)
        for record in batch:
            self._report(record, outcomes[record.number])

    def drop(self) -> None:
        """Report the batch as not sent (Ctrl-C came before it was handed to the producer)."""
        batch, self.batch = self.batch, []
        for record in batch:
            self._tally.failed(record.number, record.key, NOT_SENT, self._args.json)

    async def _publish(self, batch: list[Record]) -> dict[int, Outcome]:
        """One ``publish_many`` per key (in record order), keys concurrently; then the records
        whose publish was refused as a whole, one at a time: a refused MPUB stored nothing but
        does not say which record it refused, and a record alone gets its own verdict. One at
        a time, so that the producer does not group them into one command again."""
        groups: dict[str | None, list[Record]] = {}
        for record in batch:
            groups.setdefault(record.key, []).append(record)
        settled = await asyncio.gather(*(self._publish_group(k, rs) for k, rs in groups.items()))
        outcomes: dict[int, Outcome] = {}
        for records, results in zip(groups.values(), settled, strict=True):
            for record, result in zip(records, results, strict=True):
                outcomes[record.number] = result
        if len(batch) > 1 and self._args.defer is None:  # a DPUB is always one message alone
            for record in batch:
                if self._stop.is_set():
                    break  # Ctrl-C: nothing more is sent; the refusal stands
                if isinstance(outcomes[record.number], REFUSALS):
                    outcomes[record.number] = await self._publish_one(record)
        return outcomes

    async def _publish_group(self, key: str | None, records: list[Record]) -> list[Outcome]:
        if self._args.defer is not None or len(records) == 1:
            return [await self._publish_one(r) for r in records]
        try:
            results = await self._producer.publish_many(
                self._topic,
                [r.body for r in records],
                sharding_key=key,
                partition=self._args.partition,
                trace_ids=[r.trace_id for r in records] if self._args.trace else None,
                ext=self._ext,
            )
            return list(results)
        except PublishError as exc:
            if exc.results is not None and len(exc.results) == len(records):
                return [
                    r if isinstance(r, PublishResult | BaseException) else exc for r in exc.results
                ]
            return [exc] * len(records)
        except NsqError as exc:
            return [exc] * len(records)

    async def _publish_one(self, record: Record) -> Outcome:
        try:
            return await self._producer.publish(
                self._topic,
                record.body,
                sharding_key=record.key,
                partition=self._args.partition,
                trace_id=record.trace_id,
                ext=self._ext,
                defer=self._args.defer,
            )
        except NsqError as exc:
            return exc

    def _report(self, record: Record, outcome: Outcome) -> None:
        tally = self._tally
        if isinstance(outcome, PublishResult):
            tally.summary["published"] += 1
            tally.per_partition["-" if outcome.partition is None else str(outcome.partition)] += 1
            if self._args.json:
                print(json.dumps(result_json(record, outcome)), flush=True)
        else:
            tally.failed(record.number, record.key, outcome, self._args.json)
