"""Scheduling policies over one token-budget core. ``POLICIES`` maps scenario names to classes;
configuration asks :func:`describe` for the few facts it needs of a policy, never the class."""

import sys
from dataclasses import dataclass

from simserve.sched.core import Batch, Scheduler, SchedulerLimits
from simserve.sched.fastserve import FastServe
from simserve.sched.lmdeploy import Lmdeploy
from simserve.sched.orca import Orca
from simserve.sched.plan import StepPlan
from simserve.sched.priority import Priority
from simserve.sched.request import Request, Status
from simserve.sched.s3 import S3
from simserve.sched.sarathi import Sarathi
from simserve.sched.static import Static
from simserve.sched.tgi import Tgi
from simserve.sched.trtllm import TrtllmGuaranteedNoEvict, TrtllmMaxUtilization
from simserve.sched.vllm_v0 import VllmV0
from simserve.sched.vllm_native import VllmNative
from simserve.sched.vllm_v1 import VllmV1

POLICIES: dict[str, type[Scheduler]] = {
    cls.name: cls for cls in (Static, Orca, VllmV0, VllmV1, Sarathi, Tgi, Lmdeploy, FastServe, S3,
                              TrtllmGuaranteedNoEvict, TrtllmMaxUtilization, Priority, VllmNative)
}

# policies that drive an installed serving engine's own scheduler (an optional extra): the
# property tests and the re-implementations' checks cover the others
ENGINE_POLICIES = ("vllm_native",)

# policies that can run with engine.enable_prefix_caching (vLLM v1's KV cache manager)
PREFIX_CACHING_POLICIES = ("vllm_v1", "sarathi", "priority", "vllm_native")


@dataclass(frozen=True)
class PolicyFacts:
    """What a scenario needs to know of a policy to be resolved (config, cluster/spec.py)."""

    name: str
    chunked: bool | None          # True/False: fixed by the policy; None: enable_chunked_prefill
    params_type: type | None      # its knobs, one frozen dataclass (sched.params), if any
    prefix_caching: bool          # it models engine.enable_prefix_caching
    summary: str                  # the first line of its module's docstring
    reserved_blocks: int          # KV blocks its block pool keeps back (vLLM's null block)
    engine: bool                  # it drives an installed engine's own scheduler

    @classmethod
    def of(cls, policy: type[Scheduler]) -> "PolicyFacts":
        doc = (sys.modules[policy.__module__].__doc__ or "").strip()
        return cls(policy.name, policy.chunked, policy.params_type,
                   policy.name in PREFIX_CACHING_POLICIES, doc.splitlines()[0] if doc else "",
                   policy.reserved_blocks, policy.name in ENGINE_POLICIES)


def policy_names() -> tuple[str, ...]:
    """Every policy a scenario can name (``scheduler.policy``)."""
    return tuple(POLICIES)


def describe(name: str) -> PolicyFacts:
    """The facts of the policy called ``name`` (one of :func:`policy_names`)."""
    return PolicyFacts.of(POLICIES[name])


__all__ = ["ENGINE_POLICIES", "POLICIES", "PREFIX_CACHING_POLICIES", "Batch", "PolicyFacts",
           "Request", "Scheduler", "SchedulerLimits", "Status", "StepPlan", "describe",
           "policy_names"]
