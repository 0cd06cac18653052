"""Scheduling policies over one token-budget core. ``POLICIES`` maps scenario names to classes;
configuration asks :func:`describe` for the few facts it needs of a policy, never the class."""

from simserve.sched.batch import Batch, SchedulerLimits
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
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
from simserve.sched.vllm_native import VllmNative
from simserve.sched.vllm_v0 import VllmV0
from simserve.sched.vllm_v1 import VllmV1

POLICIES: dict[str, type[Scheduler]] = {
    cls.name: cls for cls in (Static, Orca, VllmV0, VllmV1, Sarathi, Tgi, Lmdeploy, FastServe, S3,
                              TrtllmGuaranteedNoEvict, TrtllmMaxUtilization, Priority, VllmNative)
}

# policies that drive an installed serving engine's own scheduler (an optional extra): the
# property tests and the re-implementations' checks cover the others
ENGINE_POLICIES = tuple(n for n, cls in POLICIES.items() if cls.facts.engine)

# policies that can run with engine.enable_prefix_caching (vLLM v1's KV cache manager)
PREFIX_CACHING_POLICIES = tuple(n for n, cls in POLICIES.items() if cls.facts.prefix_caching)


def policy_names() -> tuple[str, ...]:
    """Every policy a scenario can name (``scheduler.policy``)."""
    return tuple(POLICIES)


def describe(name: str) -> PolicyFacts:
    """The facts of the policy called ``name`` (one of :func:`policy_names`)."""
    return POLICIES[name].facts


__all__ = ["ENGINE_POLICIES", "POLICIES", "PREFIX_CACHING_POLICIES", "Batch", "PolicyFacts",
           "Request", "Scheduler", "SchedulerLimits", "Status", "StepPlan", "describe",
           "policy_names"]
