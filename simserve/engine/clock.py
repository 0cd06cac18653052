"""The one place that touches SimPy's private API: events at an absolute time and priority.

``Environment.timeout(d)`` lands at ``now + d``. A fast-forward stretch must end exactly at the
float that stepping would reach (``(s0 + d0) + d1 ...``), which no delay can always express (a
rounding tie can make that sum unreachable from ``now``). So :meth:`Clock.at` queues an event
with its absolute time, the way ``Environment.schedule`` itself does (simpy/core.py: a heap of
``(time, priority, event id, event)``), and marks it triggered and successful the way
``Timeout.__init__`` does (``_ok``, ``_value``).

Those private names (``_queue``, ``_eid``, ``_ok``, ``_value``) were checked against SimPy
``SIMPY_CHECKED``; ``tests/unit/test_clock.py`` fails on any other version, so an upgrade is a
deliberate step: re-read simpy/core.py and simpy/events.py, then move the pin.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappush

import simpy
from simpy.core import EmptySchedule
from simpy.events import NORMAL, URGENT

__all__ = ["Clock", "EmptySchedule", "Interrupt", "LATE", "NORMAL", "SIMPY_CHECKED", "URGENT"]

SIMPY_CHECKED = "4.1.2"    # the SimPy whose private fields Clock.at writes
LATE = NORMAL + 1          # after every step completion at the same instant
Interrupt = simpy.Interrupt


class Clock(simpy.Environment):
    """SimPy's environment plus events at an absolute time and with a chosen priority."""

    def at(self, when: float, priority: int = NORMAL) -> simpy.Event:
        """A triggered event that fires when the clock reaches exactly ``when``."""
        if when < self.now:
            raise ValueError(f"cannot schedule at {when} before now ({self.now})")
        event = simpy.Event(self)
        event._ok = True          # a triggered, successful event, like a Timeout
        event._value = None
        # (SimPy types the priority as its own EventPriority, an int)
        heappush(self._queue, (when, priority, next(self._eid), event))  # type: ignore[misc]
        return event

    def call_at(self, when: float, priority: int, fn: Callable[[], None]) -> None:
        """Run ``fn()`` when the clock reaches ``when`` (at that priority)."""
        self.at(when, priority).callbacks.append(lambda _: fn())
