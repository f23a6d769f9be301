"""The chaos runner's pacer: faults land under load, and a recovery is measured under traffic."""

from __future__ import annotations

from .runner import PROFILES, Pace


def test_every_producer_task_publishes_at_least_twice_a_second() -> None:
    """A seed whose leader move failed after 90 s once set 0.375 msgs/s over 48 tasks: one
    publish per task every 128 s, so every partition looked unrecovered for ~40 s."""
    assert Pace(rate=0.375, tasks=48).period() <= 0.5
    assert Pace(rate=None, tasks=48).period() == 0.0
    assert Pace(rate=960.0, tasks=48).period() == 0.05


def test_time_lost_to_a_failed_nemesis_does_not_slow_the_producers() -> None:
    smoke = PROFILES["smoke"]
    # 1 event done in 100 s, 90 s of which went to a nemesis that failed (cluster not stable)
    rate = Pace.rate_for(smoke, acked=20000, done=1, elapsed=100.0, wasted=90.0)
    # the message target is met: 1/20 of it over the 4 events left, at 10 s an event
    assert rate == smoke.messages / 20 / (4 * 10.0)
    # before any event: the profile's guess of a cycle
    first = Pace.rate_for(smoke, acked=0, done=0, elapsed=0.0, wasted=0.0)
    assert first == smoke.messages / (smoke.events * 2.5)
