"""The contract between the HTTP front end (live/http.py) and a simulation that runs on the wall
clock (live/driver.py): a request is accepted *now*, and its output tokens come back as the
simulation emits them.

The front end never sees the engine, and the simulation never sees HTTP: a test can drive one
without the other. Everything runs on one asyncio event loop (no threads), so a
:class:`TokenStream` is handed from the simulation to one HTTP handler without locks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


class TokenStream:
    """One request's output tokens as the simulation emits them, read by one HTTP handler.

    The simulation calls :meth:`emit` when a step that sampled this request's tokens ends on
    the wall clock, and :meth:`end` when the request is done (finished or rejected); the handler
    awaits :meth:`take`, which returns every token emitted since its last call (a handler that
    falls behind gets several tokens in one chunk, as vLLM's HTTP side merges them).
    """

    __slots__ = ("request_id", "num_prompt_tokens", "num_output_tokens", "arrival_s",
                 "first_token_s", "last_token_s", "emitted", "taken", "done", "reject_reason",
                 "_wake")

    def __init__(self, request_id: int, num_prompt_tokens: int, num_output_tokens: int,
                 arrival_s: float):
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = num_output_tokens
        self.arrival_s = arrival_s           # simulated seconds since the server started
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.emitted = 0                     # tokens the simulation has emitted
        self.taken = 0                       # tokens the handler has taken
        self.done = False
        self.reject_reason = ""              # set when the simulation can never run it
        self._wake: asyncio.Future[None] | None = None

    # -- the simulation's side -------------------------------------------------------------
    def emit(self, n: int, t: float) -> None:
        """``n`` tokens left the engine at simulated time ``t``."""
        if self.first_token_s is None:
            self.first_token_s = t
        self.last_token_s = t
        self.emitted += n
        self._notify()

    def end(self, reject_reason: str = "") -> None:
        """No more tokens will come (the request finished, or can never run: ``reject_reason``)."""
        self.done = True
        self.reject_reason = reject_reason
        self._notify()

    def _notify(self) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    # -- the handler's side ----------------------------------------------------------------
    async def take(self) -> int:
        """Wait for tokens; the number emitted since the last call (0 once the stream is over)."""
        while self.emitted == self.taken and not self.done:
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await self._wake
            finally:
                self._wake = None
        n = self.emitted - self.taken
        self.taken = self.emitted
        return n


# vLLM's bucket bounds (vllm/v1/metrics/buckets.py), seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True)
class Histogram:
    """Observations counted into buckets: ``counts[i]`` of them were <= ``bounds[i]`` and above
    the bound before; ``counts[-1]`` above every bound (Prometheus' +Inf bucket, uncumulated)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float                   # the sum of the observations

    @staticmethod
    def empty(bounds: tuple[float, ...]) -> Histogram:
        return Histogram(bounds, (0,) * (len(bounds) + 1), 0.0)

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class ReplicaStats:
    """One replica's state and counters, as vLLM's Prometheus metrics name them (/metrics)."""

    index: int
    num_running: int               # vllm:num_requests_running
    num_waiting: int               # vllm:num_requests_waiting (swapped out counts as waiting)
    kv_usage: float                # vllm:kv_cache_usage_perc (a fraction, 1 = full)
    num_preemptions: int           # vllm:num_preemptions_total
    prompt_tokens: int             # vllm:prompt_tokens_total (prompts of finished requests)
    generation_tokens: int         # vllm:generation_tokens_total
    requests_finished: int         # vllm:request_success_total, every finished_reason
    # vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
    # vllm:e2e_request_latency_seconds (simulated times: from the request's arrival)
    ttft: Histogram = Histogram.empty(TTFT_BUCKETS)
    itl: Histogram = Histogram.empty(ITL_BUCKETS)
    e2el: Histogram = Histogram.empty(E2E_BUCKETS)
    # requests_finished by the finish_reason their responses carry ("stop", "length")
    finished_by_reason: Mapping[str, int] = field(default_factory=dict)


class LiveSimulation(Protocol):
    """A simulation that accepts requests as they come and emits their tokens on the wall clock.

    ``submit`` never blocks and never fails for back-pressure: like vLLM, the simulation queues
    what it cannot run yet. A request that can never run (longer than the replica's context or
    KV cache) comes back as a stream that is already ``done`` with its ``reject_reason``.
    """

    model_name: str
    max_model_len: int
    vocab_size: int
    error: BaseException | None    # set once the simulation has stopped on an error

    def submit(self, num_prompt_tokens: int, num_output_tokens: int,
               replica: int | None = None, finish_reason: str = "length") -> TokenStream:
        """Accept a request now; ``replica`` pins it to one replica (one port per replica),
        None lets the scenario's router choose; ``finish_reason``: what its response will say
        when it ends (counted by /metrics as vLLM counts it)."""
        ...

    def draw_output_tokens(self) -> int:
        """An output length from the scenario's workload, for a request that does not fix it."""
        ...

    def stats(self) -> list[ReplicaStats]:
        ...

    def now(self) -> float:
        """Simulated seconds since the simulation started (the wall clock it runs on)."""
        ...
