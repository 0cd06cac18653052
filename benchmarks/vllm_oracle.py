"""The vLLM oracle: simserve's ``vllm_v1`` and ``priority`` held to vLLM's own scheduler, step
for step.

Each case runs twice through simserve's event loop, one iteration per event (``--stepwise``),
under the same latency model: once with the re-implemented policy, once with ``vllm_native``
(vLLM v1's real ``Scheduler`` and ``KVCacheManager``, driven with a fake forward pass). While
the decisions agree the two runs see the same clock, so every step can be compared: the
requests scheduled and their token counts, the requests preempted, the prefix-cache hit of each
request admitted, the requests finished, and the free KV blocks after the step. The first
difference is printed with a few steps of context; after it the runs no longer share a clock,
so a case's score is the share of its steps before the first difference (100 % = identical).

Cases: ``--cases`` random scenarios (knobs, lengths, arrival bursts, KV so small that
preemption is frequent, shared prefixes with prefix caching, priorities; ``--requests`` each)
and, with ``--shipped``, every shipped scenario whose policy is ``vllm_v1`` or ``priority``.

``--async`` runs every case with ``engine.async_scheduling`` (vLLM's AsyncScheduler driven in
its engine core's batch-queue order: step n+1 scheduled before step n's output is applied).

``--pp P`` runs every case with ``engine.pipeline_parallel_size`` P (0: 2, 3 or 4, drawn per
case): vLLM's synchronous scheduler built with that PP size, under simserve's pipeline loop
(engine/pipeline.py: a batch queue of P micro-batches, each one's output applied when it leaves
the last stage, an empty schedule holding a slot as in vLLM's ``step_with_batch_queue``),
priced by the roofline split over the stages (the linear model has no layers to split).
Shipped cases are not run with ``--pp`` (none is pipelined).

``--pp P --async`` runs vLLM 0.32's default with PP on GPUs: its ``AsyncScheduler`` built with
that PP size and the V2 model runner's flag set after construction (the CPU build cannot
configure that runner; sched/vllm_native.py), under simserve's pipeline loop with a batch queue
of P + 1 (vLLM's ``max_concurrent_batches``): a request that samples may run again only P
``schedule()`` calls later, its previous token still in flight.

Needs vLLM importable beside simserve (``make oracle`` builds that environment):

    python benchmarks/vllm_oracle.py --cases 200 --requests 300 --shipped [--async]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simserve.engine.build import build_replicas, engine_options  # noqa: E402
from simserve.config import load_variants, parse_scenario  # noqa: E402
from simserve.engine import simulate  # noqa: E402
from simserve.runner import collect  # noqa: E402
from simserve.workload import build_workload  # noqa: E402
from simserve.workload.spec import RequestSpec  # noqa: E402

ORACLE = "vllm_native"
CHECKED = ("vllm_v1", "priority")


class Step(NamedTuple):
    """One iteration's decisions, as both sides record them."""

    replica: int
    scheduled: tuple[tuple[int, int], ...]     # (request id, new tokens), in schedule order
    preempted: tuple[int, ...]
    admitted: tuple[tuple[int, int], ...]      # (request id, tokens already computed: cache hit)
    finished: tuple[int, ...]
    free_blocks: int                           # after the step


def traced(sched, log: list[Step], replica: int = 0) -> None:
    """Record every non-empty step the engine runs on ``sched`` into ``log``: what was decided
    when it was scheduled, what finished and the free blocks when its output was applied
    (``complete``; with async scheduling or pipelining ``launch`` then ``deliver``, later).
    A request leaves ``running`` inside ``schedule()`` only by preemption (finishing is applied
    between schedules), so each call's preempted and admitted requests are its own running
    list before and after; an empty schedule's preemptions are counted with the next step."""
    schedule = sched.schedule
    decided: list[list] = []       # steps scheduled, output not yet applied, oldest first
    carried: set = set()           # preempted by empty schedules since the last step

    def traced_schedule():
        was = {r.id for r in sched.running}
        plan = schedule()
        after = [r for r in sched.running]
        preempted = carried | (was - {r.id for r in after})
        if plan.is_empty:
            carried.clear()
            carried.update(preempted)
            return plan
        carried.clear()
        decided.append([
            replica,
            tuple(zip(plan.request_ids, plan.num_new_tokens)),
            tuple(sorted(preempted)),
            tuple(sorted((r.id, r.num_computed_tokens) for r in after if r.id not in was)),
        ])
        return plan

    def applied(finished):
        log.append(Step(*decided.pop(0), tuple(sorted(r.id for r in finished)),
                        sched.blocks.num_free))
        return finished

    sched.schedule = traced_schedule
    if sched.overlap:
        deliver = sched.deliver
        sched.deliver = lambda step, t_end: applied(deliver(step, t_end))
    else:
        complete = sched.complete
        sched.complete = lambda plan, t_end: applied(complete(plan, t_end))


def run_policy(s, specs: list[RequestSpec], policy: str, params=None):
    """One stepwise run of ``specs`` on scenario ``s`` under ``policy``: (steps, result)."""
    s = s.replace(policy=policy, policy_params=params)
    replicas = build_replicas(s)
    log: list[Step] = []     # every replica's steps, in the order they complete
    for r in replicas:
        traced(r.scheduler, log, r.index)
    rec = simulate(specs, replicas, fast_forward=False, **engine_options(s, replicas))
    return log, collect(s, rec, replicas)


def native_params(policy: str):
    from simserve.sched.vllm_native import VllmNativeParams
    return VllmNativeParams(scheduling_policy="priority" if policy == "priority" else "fcfs")


@dataclasses.dataclass
class Outcome:
    name: str
    policy: str
    steps: int
    same: int                   # steps before the first difference
    first_diff: str
    ours: dict
    theirs: dict
    seconds: tuple[float, float]

    @property
    def identical(self) -> bool:
        return not self.first_diff


def describe(i: int, ours: list[Step], theirs: list[Step], context: int = 2) -> str:
    lines = [f"first difference at step {i}:"]
    for j in range(max(0, i - context), min(i + 1, max(len(ours), len(theirs)))):
        mark = ">>" if j == i else "  "
        for who, log in (("simserve", ours), ("vllm    ", theirs)):
            lines.append(f"  {mark} step {j} {who}: {_fmt(log[j]) if j < len(log) else '(none)'}")
    return "\n".join(lines)


def _fmt(step: Step) -> str:
    sched = ", ".join(f"{r}:{n}" for r, n in step.scheduled[:12])
    more = f" … (+{len(step.scheduled) - 12})" if len(step.scheduled) > 12 else ""
    return (f"replica {step.replica} [{sched}{more}] preempted={list(step.preempted)} "
            f"admitted={list(step.admitted)} finished={list(step.finished)} "
            f"free={step.free_blocks}")


def metrics(result) -> dict:
    s = result.summary
    return {"completed": s["completed"],
            "preemptions": int(result.requests["num_preemptions"].sum()),
            "mean_ttft_ms": s["mean_ttft_ms"], "mean_tpot_ms": s["mean_tpot_ms"],
            "duration_s": s["duration_s"]}


def check(name: str, s, specs: list[RequestSpec]) -> Outcome:
    policy = s.policy
    t0 = time.perf_counter()
    ours, ours_result = run_policy(s, specs, policy, s.policy_params)
    t1 = time.perf_counter()
    theirs, theirs_result = run_policy(s, specs, ORACLE, native_params(policy))
    t2 = time.perf_counter()
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                min(len(ours), len(theirs)))
    diff = "" if same == len(ours) == len(theirs) else describe(same, ours, theirs)
    return Outcome(name, policy, max(len(ours), len(theirs)), same, diff, metrics(ours_result),
                   metrics(theirs_result), (t1 - t0, t2 - t1))


# -- cases --------------------------------------------------------------------------------------

def random_case(seed: int, num_requests: int, async_scheduling: bool = False, pp: int = 1):
    """A scenario and its requests, drawn so that KV memory binds often (with ``pp`` stages:
    0 draws 2, 3 or 4 from the case's own stream, after everything else)."""
    rng = np.random.default_rng(seed)
    policy = str(rng.choice(CHECKED, p=[0.7, 0.3]))
    block_size = int(rng.choice([8, 16, 32]))
    max_model_len = int(rng.choice([1024, 2048]))
    chunked = bool(rng.random() < 0.75)
    prefix = bool(rng.random() < 0.35)
    budget = int(rng.choice([64, 128, 256, 512, 1024, 2048])) if chunked else \
        int(rng.choice([max_model_len, 2 * max_model_len]))
    long_threshold = int(rng.choice([0, 0, 0, 32, 128, 512]))
    max_num_seqs = int(rng.choice([4, 8, 16, 32, 64, 128]))
    # (vLLM refuses a token budget below max_num_seqs: a draw of 64 and 128 is held to 64)
    max_num_seqs = min(max_num_seqs, budget)
    # lengths: short chat-like, long prompts, or long outputs
    shape = rng.choice(["chat", "long_prompt", "long_output"])
    if shape == "chat":
        prompts = rng.integers(1, 400, num_requests)
        outputs = rng.integers(1, 200, num_requests)
    elif shape == "long_prompt":
        prompts = rng.integers(200, max_model_len // 2, num_requests)
        outputs = rng.integers(1, 64, num_requests)
    else:
        prompts = rng.integers(1, 128, num_requests)
        outputs = rng.integers(64, max_model_len // 2, num_requests)
    longest = int(max(prompts + outputs))
    need = -(-longest // block_size)
    # from "one long request barely fits" to a few times that: preemption is common
    num_blocks = int(need + 1 + rng.integers(0, 4 * need))
    # arrivals: one burst, Poisson, or bursts of several at one instant
    kind = rng.choice(["burst", "poisson", "bursts"])
    if kind == "burst":
        arrivals = np.zeros(num_requests)
    elif kind == "poisson":
        arrivals = np.cumsum(rng.exponential(1 / float(rng.choice([5, 20, 80])), num_requests))
    else:
        groups = rng.integers(0, num_requests // 8 + 1, num_requests)
        arrivals = np.sort(groups * float(rng.choice([0.05, 0.5, 2.0])))
    specs = []
    pool = rng.integers(0, 6, 8) if prefix else None   # a few shared "system prompts"
    for i in range(num_requests):
        ids = None
        if prefix:
            n_ids = -(-int(prompts[i]) // 512)
            ids = tuple(int(x) for x in pool[: rng.integers(0, n_ids + 1)]) + \
                tuple(int(x) for x in 100 + rng.integers(0, 3, n_ids))
            ids = ids[:n_ids]
        priority = int(rng.integers(0, 4)) if policy == "priority" else 0
        specs.append(RequestSpec(i, float(arrivals[i]), int(prompts[i]), int(outputs[i]),
                                 ids, priority))
    raw = {
        "name": f"random-{seed}", "seed": seed, "model": "tiny-llama-45m",
        "hardware": "cpu-epyc-2core",
        "engine": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": budget,
                   "block_size": block_size, "num_gpu_blocks": num_blocks,
                   "enable_chunked_prefill": chunked,
                   "long_prefill_token_threshold": long_threshold,
                   "max_model_len": max_model_len, "enable_prefix_caching": prefix,
                   "async_scheduling": async_scheduling},
        "scheduler": {"policy": policy},
        "latency": {"model": "linear", "base_ms": 4.0, "per_token_ms": 0.05, "per_seq_ms": 0.2},
        # (the requests are drawn above; this section only has to parse)
        "workload": {"num_requests": num_requests, "rate": 1.0,
                     "prompt": {"dist": "fixed", "value": 1},
                     "output": {"dist": "fixed", "value": 1}},
    }
    if pp != 1:   # (the linear model has no layers to split over stages: the roofline)
        raw["engine"]["pipeline_parallel_size"] = int(rng.choice([2, 3, 4])) if pp == 0 else pp
        raw["latency"] = {"model": "roofline"}
    return parse_scenario(raw), specs


def shipped_cases(async_scheduling: bool = False):
    """Every shipped scenario (and compare-file variant) whose policy is a checked one (with
    ``engine.async_scheduling`` set as asked)."""
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        try:
            variants = load_variants(path)
        except Exception as e:   # noqa: BLE001  (a file of another kind: sweep grids)
            print(f"  (skipping {path.name}: {e})")
            continue
        for label, s in variants:
            if s.policy not in CHECKED or s.cluster.disaggregated:
                continue
            # vllm_native builds no drafter and no KV connector: vLLM's scheduler with
            # speculative decoding or KV offloading is not what it drives
            unexpressed = [k for k in ("speculative_config", "kv_offloading_size")
                           if getattr(s.engine, k) is not None]
            if unexpressed:
                print(f"  (skipping {path.stem}:{label}: engine.{unexpressed[0]} is not "
                      f"driven by vllm_native)")
                continue
            if async_scheduling:
                if s.cluster.faults is not None and s.cluster.faults.enabled \
                        or s.engine.preemption_mode == "swap":
                    print(f"  (skipping {path.stem}:{label}: not modelled with async "
                          f"scheduling)")
                    continue
                s = s.replace(engine=dataclasses.replace(s.engine, async_scheduling=True))
            specs = build_workload(s.workload, s.seed, s.base_dir)
            yield f"{path.stem}:{label}", s, specs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200, help="random scenarios (default 200)")
    ap.add_argument("--requests", type=int, default=300, help="requests per random scenario")
    ap.add_argument("--seed", type=int, default=0, help="first random scenario's seed")
    ap.add_argument("--shipped", action="store_true", help="also the shipped scenarios")
    ap.add_argument("--show", type=int, default=3, help="differences printed in full")
    ap.add_argument("--async", dest="async_scheduling", action="store_true",
                    help="every case with engine.async_scheduling (vLLM's AsyncScheduler)")
    ap.add_argument("--pp", type=int, default=1, metavar="P",
                    help="every random case with engine.pipeline_parallel_size P (0: 2, 3 or "
                         "4 drawn per case); with --async vLLM's V2-runner async PP; not "
                         "with --shipped")
    args = ap.parse_args(argv)
    if args.pp != 1 and (args.shipped or args.pp < 0):
        print("error: --pp: a size >= 0 (not 1), without --shipped", file=sys.stderr)
        return 2

    from simserve.sched.vllm_native import vllm_version
    version = vllm_version()
    if version is None:
        print("error: vLLM is not installed here (make oracle builds an environment with it)",
              file=sys.stderr)
        return 2
    mode = "async scheduling (AsyncScheduler, batch queue of 2)" if args.async_scheduling \
        else "synchronous scheduling"
    if args.pp != 1:
        mode = "synchronous scheduling" if not args.async_scheduling else \
            "async scheduling (AsyncScheduler, its V2-runner decode cadence)"
        mode += (f", pipeline parallelism ({'2-4' if args.pp == 0 else args.pp} stages: "
                 f"a batch queue of that many micro-batches"
                 f"{', plus one' if args.async_scheduling else ''})")
    print(f"vLLM oracle: simserve {', '.join(CHECKED)} against vLLM {version}'s own scheduler "
          f"(offline, fake forward pass), one step per event, {mode}")
    cases = [(f"random-{args.seed + i}",
              *random_case(args.seed + i, args.requests, args.async_scheduling, args.pp))
             for i in range(args.cases)]
    if args.shipped:
        cases += list(shipped_cases(args.async_scheduling))
    outcomes: list[Outcome] = []
    shown = 0
    print(f"{'case':28s} {'policy':9s} {'steps':>6s} {'same':>7s}  preemptions ours/vLLM  "
          f"TTFT mean ms ours/vLLM  s ours/vLLM")
    for name, s, specs in cases:
        o = check(name, s, specs)
        outcomes.append(o)
        share = 100.0 * o.same / o.steps if o.steps else 100.0
        if args.pp != 1:
            name = f"{name} pp{s.engine.pipeline_parallel_size}"
        print(f"{name:28s} {o.policy:9s} {o.steps:6d} {share:6.2f}%  "
              f"{o.ours['preemptions']:6d} / {o.theirs['preemptions']:<6d}  "
              f"{o.ours['mean_ttft_ms']:10.1f} / {o.theirs['mean_ttft_ms']:<10.1f} "
              f"{o.seconds[0]:5.1f}/{o.seconds[1]:5.1f}", flush=True)
        if o.first_diff and shown < args.show:
            print(o.first_diff)
            shown += 1
    identical = sum(o.identical for o in outcomes)
    steps = sum(o.steps for o in outcomes)
    same = sum(o.same for o in outcomes)
    print(f"\n{identical} of {len(outcomes)} cases identical step for step; "
          f"{same} of {steps} steps ({100.0 * same / max(steps, 1):.2f} %) before any case's "
          f"first difference; vLLM {version}")
    ours_s = sum(o.seconds[0] for o in outcomes)
    theirs_s = sum(o.seconds[1] for o in outcomes)
    print(f"time: simserve policies {ours_s:.1f} s, vllm_native {theirs_s:.1f} s "
          f"({theirs_s / max(ours_s, 1e-9):.1f}x)")
    return 0 if identical == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
