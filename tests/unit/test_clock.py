"""engine/clock.py is the one module that writes SimPy's private fields: pinned and checked."""

from importlib.metadata import version

import pytest

from simserve.engine.clock import LATE, NORMAL, SIMPY_CHECKED, URGENT, Clock


def test_simpy_is_the_version_clock_was_checked_against():
    # an upgrade is deliberate: re-read simpy/core.py and simpy/events.py, then move the pin
    assert version("simpy") == SIMPY_CHECKED


def test_events_fire_at_the_absolute_time_in_priority_order():
    env = Clock()
    seen = []
    when = 0.1 + 0.2          # not reachable as now + some delay from every start
    env.call_at(when, LATE, lambda: seen.append(("late", env.now)))
    env.call_at(when, NORMAL, lambda: seen.append(("normal", env.now)))
    env.call_at(when, URGENT, lambda: seen.append(("urgent", env.now)))
    env.call_at(0.05, NORMAL, lambda: seen.append(("first", env.now)))
    env.run()
    assert seen == [("first", 0.05), ("urgent", when), ("normal", when), ("late", when)]
    assert seen[1][1] == 0.30000000000000004          # the exact float, not 0.3


def test_a_process_waits_on_an_absolute_time():
    env = Clock()
    out = []

    def proc():
        yield env.at(2.5)
        out.append(env.now)
        yield env.timeout(1.0)
        out.append(env.now)

    env.process(proc())
    env.run()
    assert out == [2.5, 3.5]


def test_the_past_is_refused():
    env = Clock()
    env.run(until=1.0)
    with pytest.raises(ValueError, match="before now"):
        env.at(0.5)
