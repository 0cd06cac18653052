"""The benchmark client's concurrency limit: ``vllm bench serve --max-concurrency``.

vLLM's client sends each request at its arrival time, but through a semaphore of
``max_concurrency`` slots (``vllm/benchmarks/serve.py``, ``limited_request_func``): a request due
while every slot is taken waits until a request ends, and its latencies count from when it is
actually sent. With ``rate: inf`` (every request due at once) this is a closed loop of
``max_concurrency`` clients, each sending its next request when its last one ends.

:class:`ClientGate` is that semaphore on the simulated clock. The engine asks it before each
arrival (:meth:`admits`, or :meth:`wait` for the next free slot), moves the request's arrival
to the time it is sent (:meth:`send`), and tells it when requests end (:meth:`release`).
Runs with a gate are stepped one iteration at a time: an arrival that depends on a finish
cannot be known ahead, which fast-forward needs.

With a front-end delay ``h`` (``latency.frontend_delay_ms``, a calibrated profile's
``frontend_delay_s``: the engine's clock runs ``h`` behind the client's, ``runner.collect``)
the client learns that a request ended ``h`` after the engine ends it, so a slot frees ``h``
later on the engine's clock (``delay_s``), and the next request, sent then, reaches the engine
``h`` after it is sent, as every request does.
"""

from __future__ import annotations

from dataclasses import replace

import simpy

from simserve.workload.spec import RequestSpec


class ClientGate:
    """At most ``limit`` requests in flight (sent and not yet finished, rejected or failed)."""

    def __init__(self, limit: int, delay_s: float = 0.0):
        if limit < 1:
            raise ValueError("max_concurrency must be >= 1")
        self.limit = limit
        self.delay_s = delay_s    # the front-end delay: a slot frees this long after the end
        self.in_flight = 0
        self._freed: simpy.Event | None = None

    def admits(self) -> bool:
        return self.in_flight < self.limit

    def wait(self, env: simpy.Environment) -> simpy.Event:
        """An event that fires when a slot frees."""
        if self._freed is None or self._freed.triggered:
            self._freed = env.event()
        return self._freed

    def send(self, spec: RequestSpec, now: float) -> RequestSpec:
        """Take a slot; the request as sent (its arrival moved to ``now`` if it waited)."""
        self.in_flight += 1
        return spec if spec.arrival_s >= now else replace(spec, arrival_s=now)

    def release(self, n: int) -> None:
        """``n`` requests ended: free their slots and wake a waiting sender."""
        self.in_flight -= n
        if n and self._freed is not None and not self._freed.triggered:
            self._freed.succeed()
