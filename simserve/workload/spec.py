"""The workload's output: immutable request specifications, sorted by arrival."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What a client sends: when, how long the prompt is, how many tokens it wants back.

    ``num_output_tokens`` is exact (the replay client sends ``max_tokens = min_tokens`` with
    ``ignore_eos``), so the simulator and a real server produce the same number of tokens.
    ``hash_ids`` are optional prefix-block ids from a trace (Mooncake: one id per 512 prompt
    tokens; equal ids mean identical content), used by prefix caching. ``priority`` (lower value
    = served first, as vLLM's ``priority``) and ``klass`` (the request class's name, for
    per-class SLOs and goodput) come from ``workload.classes`` or a trace's columns.
    """

    request_id: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    hash_ids: tuple[int, ...] | None = None
    priority: int = 0
    klass: str = ""

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: num_prompt_tokens must be >= 1")
        if self.num_output_tokens < 1:
            raise ValueError(f"request {self.request_id}: num_output_tokens must be >= 1")
        if self.arrival_s < 0:
            raise ValueError(f"request {self.request_id}: arrival_s must be >= 0")
