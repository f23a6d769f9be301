"""The pytest plugin: NSQ_HA_REQUIRE_SERVERS, and skip-or-fail when a server is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsq_ha.testing.plugin import ALL_SERVERS, required_servers

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "tests" / "integration" / "test_smoke_servers.py"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", frozenset()),
        ("0", frozenset()),
        ("1", ALL_SERVERS),
        ("all", ALL_SERVERS),
        ("vanilla", frozenset({"vanilla"})),
        (" vanilla , fork ", frozenset({"vanilla", "fork"})),
    ],
)
def test_required_servers(monkeypatch: pytest.MonkeyPatch, value: str, expected: object) -> None:
    monkeypatch.setenv("NSQ_HA_REQUIRE_SERVERS", value)
    assert required_servers() == expected


def test_required_servers_rejects_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQ_HA_REQUIRE_SERVERS", "vanilla,kafka")
    with pytest.raises(pytest.UsageError, match="kafka"):
        required_servers()


def _run_smoke_without_servers(tmp_path: Path, require: str) -> subprocess.CompletedProcess[str]:
    """Run the smoke tests with an empty server cache and no Go on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NSQ_HA_FORK_BIN_DIR", "NSQ_HA_VANILLA_BIN_DIR", "NSQ_HA_REQUIRE_SERVERS")
    }
    env.update(PATH="/usr/bin:/bin", NSQ_HA_CACHE_DIR=str(tmp_path / "cache"))
    if require:
        env["NSQ_HA_REQUIRE_SERVERS"] = require
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q", str(SMOKE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_missing_servers_are_skipped_with_a_reason(tmp_path: Path) -> None:
    out = _run_smoke_without_servers(tmp_path, require="")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 skipped" in out.stdout
    assert "are not built" in out.stdout
    assert "run `make servers`" in out.stdout


def test_missing_required_servers_fail(tmp_path: Path) -> None:
    out = _run_smoke_without_servers(tmp_path, require="1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "3 errors" in out.stdout  # fixture failures are reported as errors
    assert "NSQ_HA_REQUIRE_SERVERS requires" in out.stdout


def test_only_the_named_server_is_required(tmp_path: Path) -> None:
    out = _run_smoke_without_servers(tmp_path, require="vanilla")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 skipped, 1 error" in out.stdout
