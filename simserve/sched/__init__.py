"""Scheduling policies over one token-budget core. ``POLICIES`` maps scenario names to classes."""

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

__all__ = ["ENGINE_POLICIES", "POLICIES", "PREFIX_CACHING_POLICIES", "Batch", "Request", "Scheduler",
           "SchedulerLimits", "Status", "StepPlan"]
