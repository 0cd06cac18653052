"""What a policy is, as one frozen record its class declares (``Scheduler.facts``): what the
engine may do with it and what configuration must check. docs/architecture.md explains each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicyFacts:
    # True/False: the policy fixes chunked prefill; None: engine.enable_chunked_prefill decides
    chunked: bool | None = None
    # its knobs, one frozen dataclass read from ``scheduler:`` (sched/params.py), if any
    params_type: type | None = None
    # KV blocks its block pool keeps back (vLLM's null block): the block manager gets
    # num_gpu_blocks minus these
    reserved_blocks: int = 0
    # it models engine.enable_prefix_caching (vLLM v1's KV cache manager)
    prefix_caching: bool = False
    # it drives an installed serving engine's own scheduler (an optional extra)
    engine: bool = False
    # once a step decodes every running request with no preemption, swap or admission, the
    # same decision repeats for as long as no request finishes or arrives and free KV blocks
    # only shrink: the engine fast-forwards such stretches without calling schedule()
    # (sched/stretch.py). A policy that counts steps or uses timers leaves it False
    monotone_admission: bool = False
    # moreover, with nothing waiting or swapped, the step after some requests finish decodes
    # every request left, and the step after one in which every running request sampled
    # decodes them all: a stretch may run past finishes and start with a mixed step
    continues_past_finish: bool = False
    # moreover, ``stretch_admits`` says when arrivals during a stretch past finishes would be
    # admitted whole at the step that first sees them: they join it (the solo loop)
    joins_stretch: bool = False
    # decodes go through the shared verbs, which verify speculative drafts
    # (engine.speculative_config)
    speculates: bool = False
    # the engine may hold a step's requests out of the queues while it is in flight and
    # schedule the next micro-batch from the rest (pipeline parallelism: ``park``)
    pipelines: bool = False
    # moreover, micro-batches in flight stay in ``running`` as vLLM v1 holds them (``launch`` /
    # ``deliver``): a request waits only while a token it samples is in flight
    pipeline_launch: bool = False
