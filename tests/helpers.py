"""Factories for hand-stepped scheduler tests (in the manner of vLLM's tests/v1/core)."""

from __future__ import annotations

from simserve.kv.blocks import BlockManager
from simserve.sched import POLICIES, Request, Scheduler, SchedulerLimits, StepPlan
from simserve.workload.spec import RequestSpec


def make_scheduler(policy: str, *, budget: int = 100, max_num_seqs: int = 8, block_size: int = 4,
                   num_blocks: int = 100, chunked: bool = True, threshold: int = 0,
                   mode: str = "recompute", host_blocks: int = 0,
                   pipeline_parallel_size: int = 1,
                   async_scheduling: bool = False) -> Scheduler:
    limits = SchedulerLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                             enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold,
                             preemption_mode=mode, pipeline_parallel_size=pipeline_parallel_size,
                             async_scheduling=async_scheduling)
    return POLICIES[policy](limits, BlockManager(num_blocks, block_size, host_blocks))


def make_request(rid: int, prompt: int, output: int, arrival: float = 0.0) -> Request:
    return Request(RequestSpec(rid, arrival, prompt, output))


def step(sched: Scheduler, t: float = 0.0) -> StepPlan:
    """One iteration: schedule, then apply the plan as if it took no time."""
    plan = sched.schedule()
    sched.complete(plan, t)
    return plan


def tokens(plan: StepPlan) -> dict[int, int]:
    return dict(zip(plan.request_ids, plan.num_new_tokens))
