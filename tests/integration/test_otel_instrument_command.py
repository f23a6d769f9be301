"""Tracing with no code change: ``opentelemetry-instrument --traces_exporter console python
app.py`` finds nsq_ha's instrumentor through its ``opentelemetry_instrumentor`` entry point and
traces a program that has no OpenTelemetry code (tests/integration/otel_app.py, on the embedded
broker): a publish span per message, and for every message consumed with ``async for`` or the
blocking ``get()`` a receive span and a process span tied to that publish, a settle span for its
``finish()``, each with the consumer's IDENTIFY client_id as ``messaging.client.id``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
pytest.importorskip("opentelemetry.instrumentation", reason="the otel extra is not installed")

from . import otel_app

APP = Path(otel_app.__file__)
LAUNCHER = Path(sys.executable).with_name("opentelemetry-instrument")

Span = dict[str, Any]


def console_spans(text: str) -> list[Span]:
    """The JSON objects the console exporter wrote, one after the other."""
    decoder = json.JSONDecoder()
    spans: list[Span] = []
    at = 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return spans
        span, at = decoder.raw_decode(text, at)
        spans.append(span)


def run_instrumented(tmp_path: Path) -> tuple[list[Span], dict[str, list[list[Any]]]]:
    out = tmp_path / "consumed.json"
    env = {
        **os.environ,
        "OTEL_SERVICE_NAME": "nsq-ha-otel-app",
        "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "",
    }
    done = subprocess.run(
        [
            str(LAUNCHER),
            "--traces_exporter",
            "console",
            "--metrics_exporter",
            "none",
            "--logs_exporter",
            "none",
            sys.executable,
            str(APP),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    return console_spans(done.stdout), json.loads(out.read_text())


def about(spans: list[Span], partition: int, message_id: str, name: str) -> list[Span]:
    """The spans called ``name`` about the message ``message_id`` of ``partition``."""
    return [
        s
        for s in spans
        if s["name"] == name
        and s["attributes"].get("messaging.message.id") == message_id
        and s["attributes"].get("messaging.destination.partition.id") == str(partition)
    ]


def linked(span: Span) -> set[str]:
    return {link["context"]["span_id"] for link in span["links"]}


def test_opentelemetry_instrument_traces_an_app_with_no_otel_code(tmp_path: Path) -> None:
    assert LAUNCHER.exists(), f"{LAUNCHER} is missing: pip install -e '.[otel]'"
    spans, consumed = run_instrumented(tmp_path)
    topic = otel_app.TOPIC
    publishes = {
        s["context"]["span_id"]: s
        for s in spans
        if s["name"] == f"publish {topic}" and s["kind"] == "SpanKind.PRODUCER"
    }
    assert len(publishes) == 2 * otel_app.COUNT, [s["name"] for s in spans]
    clients = {"async": otel_app.ASYNC_CLIENT, "sync": otel_app.SYNC_CLIENT}
    assert {k: len(v) for k, v in consumed.items()} == {"async": 2, "sync": 2}
    for way, messages in consumed.items():
        for partition, message_id in messages:
            where = f"{way} message {partition}/{message_id}"
            [receive] = about(spans, partition, message_id, f"receive {topic}")
            [process] = about(spans, partition, message_id, f"process {topic}")
            assert receive["kind"] == "SpanKind.CLIENT", where
            assert process["kind"] == "SpanKind.CONSUMER", where
            assert receive["attributes"]["messaging.operation.type"] == "receive", where
            assert process["attributes"]["messaging.operation.type"] == "process", where
            # the publish span is the process span's parent (its context came in the ext
            # header) and the receive span's link
            publish = publishes[process["parent_id"]]
            assert process["context"]["trace_id"] == publish["context"]["trace_id"], where
            assert process["parent_id"] in linked(receive), where
            assert publish["attributes"]["messaging.message.id"] == message_id, where
            for span in (receive, process):
                assert span["attributes"]["messaging.client.id"] == clients[way], where
                assert span["attributes"]["messaging.system"] == "nsq", where
            # finish() is a settle span inside the process span
            settles = [s for s in spans if s["parent_id"] == process["context"]["span_id"]]
            assert [s["name"] for s in settles] == [f"finish {topic}"], where
            assert settles[0]["attributes"]["messaging.operation.type"] == "settle", where
            assert settles[0]["attributes"]["messaging.client.id"] == clients[way], where
