"""Loading the golden recordings in tests/golden/ (copies of byte-exact server captures)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"

FLOW_FILES = ("fork_pub_sub", "fork_ext_trace", "fork_ordered", "vanilla_pub_sub")
CASE_FILES = ("fork_errors", "vanilla_errors", "identify")


@cache
def load(name: str) -> dict[str, Any]:
    """Return one golden file's JSON."""
    with (GOLDEN_DIR / f"{name}.json").open(encoding="utf-8") as handle:
        return json.load(handle)  # type: ignore[no-any-return]


def is_fork_file(name: str) -> bool:
    """True for recordings made against the fork."""
    return name.startswith("fork_")


@dataclass
class Exchange:
    """The steps of one connection, in wire order."""

    source: str
    conn: str
    fork: bool
    steps: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""
    case: dict[str, Any] = field(default_factory=dict)

    @property
    def s2c_stream(self) -> bytes:
        """Every server-to-client byte of the connection, concatenated."""
        return b"".join(bytes.fromhex(s["hex"]) for s in self.steps if s["dir"] == "s2c")


def exchanges() -> Iterator[Exchange]:
    """Yield every recorded connection of the TCP golden files."""
    for name in FLOW_FILES:
        data = load(name)
        by_conn: dict[str, Exchange] = {}
        for step in data["steps"]:
            conn = step["conn"]
            if conn not in by_conn:
                by_conn[conn] = Exchange(name, conn, is_fork_file(name))
            by_conn[conn].steps.append(step)
        yield from by_conn.values()
    for name in CASE_FILES:
        for case in load(name)["cases"]:
            fork = case.get("server_kind", "fork" if is_fork_file(name) else "vanilla") == "fork"
            yield Exchange(name, case["label"], fork, list(case["steps"]), case["label"], case)
    for index, beat in enumerate(load("identify")["heartbeat"]):
        yield Exchange(
            "identify", f"heartbeat-{index}", beat["server_kind"] == "fork", beat["steps"]
        )


def exchange_id(exchange: Exchange) -> str:
    """A readable pytest id."""
    return f"{exchange.source}:{exchange.conn}"


def masked(hex_text: str, vary: list[dict[str, int]] | None) -> bytes:
    """Return the step bytes with the ``vary`` ranges zeroed."""
    raw = bytearray(bytes.fromhex(hex_text))
    for part in vary or []:
        raw[part["from"] : part["to"]] = bytes(part["to"] - part["from"])
    return bytes(raw)
