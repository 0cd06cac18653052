"""A request as the scheduler sees it: counters that catch up.

There is no "prefill phase" object (the habit of vLLM v1's scheduler, vllm/v1/core/sched/
scheduler.py): a request has ``num_tokens`` (prompt + tokens generated so far) and
``num_computed_tokens`` (tokens whose KV is in the cache). Each step gives it some new tokens;
when ``num_computed_tokens`` reaches ``num_tokens`` the step samples one more output token.
A recompute preemption just sets ``num_computed_tokens`` back to 0.

    prompt (6)              generated (2)
    [p p p p p p | g g]     num_tokens = 8
    [x x x x x x   x]       num_computed_tokens = 7  -> next step: 1 new token (a decode)
"""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field

from simserve.workload.spec import RequestSpec


class Status(enum.Enum):
    WAITING = "waiting"      # queued: never scheduled, or preempted by recompute
    RUNNING = "running"      # holds KV blocks on the device
    SWAPPED = "swapped"      # preempted by swap: its KV blocks are in host memory
    FINISHED = "finished"
    REJECTED = "rejected"    # can never run (too long for the context or the KV cache)
    FAILED = "failed"        # lost to a replica failure (cluster.faults), not retried


@dataclass(slots=True, eq=False)
class Request:
    spec: RequestSpec
    replica: int = 0
    status: Status = Status.WAITING
    num_computed_tokens: int = 0
    num_generated: int = 0
    num_preemptions: int = 0
    first_scheduled_s: float | None = None
    finish_s: float | None = None
    reject_reason: str = ""
    # prompt tokens found in the prefix cache when first admitted (vLLM's num_cached_tokens)
    num_cached_tokens: int = 0
    # when its first output token reached the client (set by the metrics layer's token log,
    # which keeps the rest of its token times in ``tokens``: metrics/tokens.py)
    first_token_s: float | None = None
    tokens: TokenTrack | None = None
    # speculative decoding (#18): verify steps with drafts, drafts verified, drafts accepted,
    # and how often the first i+1 drafts were all accepted (vLLM's per-position counts)
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] | None = None
    # its place in the running list (stamped when it joins it): where a request held out of
    # the list while its micro-batch is in flight goes back (pipeline parallelism)
    run_seq: int = 0
    # async scheduling (Scheduler.launch/deliver): steps in flight that include it (launched,
    # their output not yet delivered), and of its ``num_generated`` the tokens those steps
    # will sample (vLLM's num_output_placeholders: counted when the step is scheduled)
    num_in_flight: int = 0
    num_pending: int = 0
    # async scheduling with pipeline parallelism (vLLM's V2 model runner): the first
    # ``schedule()`` call, by the scheduler's count, at which it may run again once it has
    # sampled (vLLM's next_decode_eligible_step; ``Scheduler.launch``); kept across preemption
    next_decode_step: int = 0
    # and when the token its latest launched micro-batch samples is out of the last stage: a
    # decode that feeds it cannot enter the first stage before (engine/pipeline.py)
    token_out_s: float = 0.0
    # copies of the spec's fields, read on every step (plain attributes are cheapest)
    id: int = field(init=False)
    num_prompt_tokens: int = field(init=False)
    num_output_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.spec.request_id
        self.num_prompt_tokens = self.spec.num_prompt_tokens
        self.num_output_tokens = self.spec.num_output_tokens

    @property
    def token_times(self) -> list[float]:
        """The time of every output token (needs a run that records tokens)."""
        if self.tokens is None:
            if self.num_generated == 0:
                return []
            raise ValueError("token times were not recorded (run with record_tokens=True)")
        return self.tokens.times()

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV cache must eventually hold."""
        return self.num_prompt_tokens + self.num_generated

    @property
    def num_remaining(self) -> int:
        """Tokens still to compute before the next output token can be sampled."""
        return self.num_prompt_tokens + self.num_generated - self.num_computed_tokens

    @property
    def max_tokens(self) -> int:
        """The most tokens this request ever occupies in the KV cache (its final length)."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_decoding(self) -> bool:
        """Feeds back exactly its last sampled token this step."""
        return self.num_generated > 0 and \
            self.num_prompt_tokens + self.num_generated - self.num_computed_tokens == 1


class TokenTrack:
    """One request's output tokens as recorded (``Request.tokens``, kept by the token log of
    the replica serving it: metrics/tokens.py): the replica step and time of its latest, and
    (with ``record``) every token's time."""

    __slots__ = ("last_step", "last_s", "runs", "ends", "earlier", "extra")

    def __init__(self, last_step: int, last_s: float, record: bool):
        self.last_step = last_step      # -2: the next token's gap spans skipped steps
        self.last_s = last_s
        self.runs: list[list[int]] | None = [] if record else None
        self.ends: array[float] | None = None     # the step ends ``runs`` index into
        self.earlier: list[float] = []            # (record) tokens of earlier replicas
        # (record, speculative decoding) steps that delivered more than one token: step index
        # -> the tokens beyond the first, all at that step's end (one streamed chunk)
        self.extra: dict[int, int] | None = None

    def flatten(self) -> None:
        """Turn the runs into earlier times (the request leaves the replica they index)."""
        if self.runs:
            self.earlier = self.times()
        self.runs, self.ends, self.extra = [], None, None

    def times(self) -> list[float]:
        """The time of every output token (needs a run that records tokens)."""
        if self.runs is None:
            raise ValueError("token times were not recorded (run with record_tokens=True)")
        ends = self.ends
        if ends is None:
            return list(self.earlier)
        if self.extra:
            extra = self.extra
            return self.earlier + [ends[i] for first, stop in self.runs
                                   for i in range(first, stop) for _ in range(1 + extra.get(i, 0))]
        return self.earlier + [ends[i] for first, stop in self.runs for i in range(first, stop)]
