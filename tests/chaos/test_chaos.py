"""The chaos runs: no acknowledged message lost, no per-key order broken, under faults.

``NSQ_HA_CHAOS_PROFILE`` picks the size (``ci``, the default: >= 30 events over >= 50k
messages; ``long``, what ``make chaos`` runs: >= 100 over >= 500k; ``smoke`` for a quick look);
``NSQ_HA_CHAOS_SEED`` replays a run's fault schedule.  Each report is printed in the session
summary and written to ``.chaos-reports/``.
"""

from __future__ import annotations

import random

import pytest

from nsq_ha.testing.servers import ForkCluster, VanillaCluster

from .backends import devcluster_backend, fork_backend, vanilla_backend
from .conftest import keep_report
from .history import Report
from .runner import Profile, profile_from_env, run_chaos, seed_from_env

pytestmark = pytest.mark.chaos


def _judge(name: str, report: Report, profile: Profile) -> None:
    text = keep_report(f"{name}-{profile.name}", report)
    assert report.ok, text
    assert report.events >= profile.events, text
    assert report.messages >= profile.messages, text


async def test_chaos_devcluster() -> None:
    """The embedded broker under its whole fault API, ordered and plain topics."""
    profile, seed = profile_from_env(), seed_from_env()
    async with devcluster_backend() as backend:
        report = await run_chaos(backend, profile, seed)
    _judge("devcluster", report, profile)


@pytest.mark.vanilla
async def test_chaos_vanilla(chaos_vanilla: VanillaCluster) -> None:
    """Real vanilla nsqd x2 behind fault proxies: restarts, SIGSTOP, cuts, stalls, slow reads."""
    profile, seed = profile_from_env(), seed_from_env()
    async with vanilla_backend(chaos_vanilla, random.Random(seed ^ 0x5EED)) as backend:  # noqa: S311
        report = await run_chaos(backend, profile, seed)
    _judge("vanilla", report, profile)


@pytest.mark.fork
async def test_chaos_fork(chaos_fork: ForkCluster) -> None:
    """The real fork, replica-3 topics: leader moves, stops, kill -9, SIGSTOP, lookupd, etcd."""
    profile, seed = profile_from_env(), seed_from_env()
    async with fork_backend(chaos_fork) as backend:
        report = await run_chaos(backend, profile, seed)
    _judge("fork", report, profile)
