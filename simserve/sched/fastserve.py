"""FastServe: skip-join multi-level feedback queue with iteration-level preemption and KV swap.

From the FastServe paper (Wu et al., "Fast Distributed Inference Serving for Large Language
Models", arXiv 2305.05920, §4) and its artifact (LLMServe/FastServe, ``fastserve/scheduler.py``,
class ``MLFQ``; read, not copied): jobs live in ``num_queues`` priority queues; queue ``i`` has
a time quantum of ``base_quantum_ms · quantum_ratio^i`` of processing time (the artifact's
10 ms, doubling). A new job *skip-joins* the highest queue whose quantum covers its first
(prefill) iteration, that iteration's time predicted at batch size 1 (the artifact's profiled
prefill time; here the replica's own latency model prices the lone prefill). Every iteration
the scheduler runs up to ``max_num_seqs`` jobs from the highest queues (FIFO within a queue), so
a job can be preempted at any iteration boundary. Each job that runs is charged the
iteration's time (the step as the latency model prices it); a job whose charge exceeds its
queue's quantum drops one queue with its charge reset. Every ``starvation_period`` iterations
(the artifact's 1,000) a job that has not run for ``starvation_ms`` (the artifact's 3 s) is
promoted to the top queue.

``quantum_unit: iterations`` is the older, iteration-counted form (kept for hand-computable
cases and for comparison with earlier results): quanta of ``base_quantum · quantum_ratio^i``
iterations, skip-join by prompt length (queue ``i`` takes prompts up to
``skip_join_tokens · quantum_ratio^i`` tokens), starvation after ``starvation_steps``
iterations. ``base_quantum_ms`` and ``starvation_ms`` are read only with ``seconds``;
``base_quantum``, ``skip_join_tokens`` and ``starvation_steps`` only with ``iterations``; one of
the other unit set to anything but its default is refused (:meth:`FastServeParams.ignored`).

New jobs are started only while at least ``host_free_fraction`` (default 0.1) of the host's
swap blocks is free (the artifact's ``MLFQ.get_next_batch`` keeps a job in its context stage
pending below 10 % free CPU blocks; its block manager has no recompute path, so this gate is
what keeps host memory from running out). Without it, a small swap space (vLLM's default 4 GiB
holds a few hundred blocks of a 13B model) fills, and every further eviction drops a job to be
recomputed while new arrivals keep preempting: the MLFQ thrashes (docs/policies.md).

Preempted jobs keep their KV on the device while it fits; when a job about to run needs blocks,
the lowest-priority jobs not running this iteration are swapped out to host memory (dropped, to
be recomputed, when the host is full or ``engine.preemption_mode`` is ``recompute``, which
leaves no swap space); a swapped job is swapped back in when it is next picked. Prompts are
prefilled whole, in the same iteration as other jobs' decodes. Those swaps are on the critical
path: the blocks freed are reused in the same step.

``proactive_swap`` (default on; the artifact's ``--proactive-offloading``, its
``block_manager.py`` / ``scheduler.py`` ``reserve_free_blocks``): after forming the batch,
keep ``reserve_blocks`` (default ``max_num_seqs``) device blocks free by swapping out the
lowest-priority paused jobs, and when no swap-out was needed, swap in the highest-priority
swapped jobs (at most ``max_num_seqs``) that fit above the reserve, so they are resident when
picked. These transfers run on separate streams alongside the step's compute
(``StepPlan.overlapped_swap_blocks``): a step pays only what they outlast it by, sharing the
host link's bandwidth with each other.

A job demoted with time quanta goes to the head of its new queue, as the artifact's
``pop_finished_requests`` pushes returning jobs to the front (the iteration form puts it at the
tail, as before). Differences from the artifact, kept on purpose: the queues are capped at
``num_queues`` (the artifact adds queues as needed). Not modelled: distributed pipeline execution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from itertools import count

from simserve.sched.batch import Batch
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
from simserve.sched.params import knob
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status


QUANTUM_UNITS = ("seconds", "iterations")


@dataclass(frozen=True)
class FastServeParams:
    num_queues: int = knob(8, min=1)
    quantum_unit: str = knob("seconds", choices=QUANTUM_UNITS)
    base_quantum_ms: float = knob(10.0, positive=True, max=1e9)   # top queue's time quantum
    starvation_ms: float = knob(3000.0, min=0.0, max=1e12)        # 0: never promote
    starvation_period: int = knob(1000, min=1)     # iterations between starvation checks
    quantum_ratio: float = knob(2.0, min=1.0)
    # quantum_unit: iterations
    base_quantum: int = knob(1, min=1)             # iterations in the top queue
    skip_join_tokens: int = knob(512, min=1)       # prompt tokens the top queue's quantum covers
    starvation_steps: int = knob(1000, min=0)      # 0: never promote
    proactive_swap: bool = knob(True)              # keep a reserve free, prefetch alongside
    reserve_blocks: int | None = knob(None, min=0)  # None: max_num_seqs (the artifact's)
    # jobs not yet started wait while less than this fraction of the host's swap blocks is
    # free (the artifact's hard-coded 0.1 in MLFQ.get_next_batch); 0: admit regardless
    host_free_fraction: float = knob(0.1, min=0.0, max=1.0)

    def ignored(self) -> tuple[str, str] | None:
        """A knob of the other ``quantum_unit`` set to anything but its default (it would be
        silently ignored): its name and why, or None. A default is let through, so a written
        scenario (every knob in it) parses back."""
        other = _ITERATION_KNOBS if self.quantum_unit == "seconds" else _SECOND_KNOBS
        for name in other:
            if getattr(self, name) != FastServeParams.__dataclass_fields__[name].default:
                return name, (f"read only with quantum_unit: {_UNIT_OF[name]} (this is "
                              f"quantum_unit: {self.quantum_unit}); remove it or change the unit")
        return None


_SECOND_KNOBS = ("base_quantum_ms", "starvation_ms")
_ITERATION_KNOBS = ("base_quantum", "skip_join_tokens", "starvation_steps")
_UNIT_OF = {**{k: "seconds" for k in _SECOND_KNOBS}, **{k: "iterations" for k in _ITERATION_KNOBS}}


class FastServe(Scheduler):
    name = "fastserve"
    # quanta and starvation are charged every iteration: every step must be scheduled
    facts = PolicyFacts(chunked=False, params_type=FastServeParams, monotone_admission=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.paused: list[Request] = []     # KV on the device, not running this iteration
        self.level: dict[int, int] = {}
        # charge in the current queue: seconds of processing (or iterations)
        self.used: dict[int, float] = {}
        self.seq: dict[int, int] = {}       # FIFO position within a queue
        self.last_run: dict[int, float] = {}   # when each job last ran (s, or iteration)
        self.step = 0
        self.now = 0.0                      # end of the last completed step (s)
        self._before = 0.0                  # end of the step completed before that one
        self._enqueued = count()
        self._to_front = count(1)           # head insertions: ever more negative positions

    @property
    def timed(self) -> bool:
        return bool(self.params.quantum_unit == "seconds")

    def _latency(self) -> Any:
        if self.latency is None:
            raise RuntimeError("fastserve's time quanta need the replica's latency model "
                               "(Scheduler.latency, bound by engine.replica.Replica)")
        return self.latency

    # -- queue state -----------------------------------------------------------------------
    def add(self, req: Request) -> None:
        super().add(req)
        if self.timed:
            level = self._join_level_time(self._prefill_time(req.num_prompt_tokens))
            # idle since its arrival, or since this scheduler's clock when it was added (a
            # retry, a KV landing): the solo loop adds an arrival after completing the step
            # it came in, where stepping added it at its arrival, the clock then ``_before``
            now = self._before if self.adds_at_step_end else self.now
            self.last_run[req.id] = max(now, req.spec.arrival_s)
        else:
            level = self._join_level(req.num_prompt_tokens)
            self.last_run[req.id] = self.step
        self._enqueue(req, level)

    @property
    def has_work(self) -> bool:
        return bool(self.paused) or super().has_work

    @property
    def num_waiting(self) -> int:
        return super().num_waiting + len(self.paused)

    def held_requests(self) -> list[Request]:
        return [*super().held_requests(), *self.paused]

    def quantum(self, level: int) -> float:
        """Queue ``level``'s quantum: seconds of processing, or iterations."""
        p: FastServeParams = self.params
        base = p.base_quantum_ms / 1e3 if self.timed else p.base_quantum
        return float(base * p.quantum_ratio ** level)

    def _prefill_time(self, prompt: int) -> float:
        """The job's first iteration alone (batch size 1), as the latency model prices it."""
        plan = StepPlan((-1,), (prompt,), (prompt,), (0,), (), 1)
        return float(self._latency().step_time(plan))

    def _join_level_time(self, prefill_s: float) -> int:
        """Skip-join by time: the highest queue whose quantum covers the first iteration."""
        last = self.params.num_queues - 1
        level = 0
        while level < last and self.quantum(level) < prefill_s:
            level += 1
        return level

    def _join_level(self, prompt: int) -> int:
        """Skip-join: the highest queue whose quantum covers the prefill."""
        p: FastServeParams = self.params
        if prompt <= p.skip_join_tokens:
            return 0
        level = math.ceil(math.log(prompt / p.skip_join_tokens, p.quantum_ratio)) \
            if p.quantum_ratio > 1 else p.num_queues - 1
        return min(level, p.num_queues - 1)

    def _enqueue(self, req: Request, level: int, front: bool = False) -> None:
        """Put ``req`` in queue ``level`` with its charge reset: at the tail, or at the head
        (``front``: ahead of every job already there)."""
        self.level[req.id] = level
        self.used[req.id] = 0
        self.seq[req.id] = -next(self._to_front) if front else next(self._enqueued)

    # -- one iteration ---------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        self.step += 1
        self._promote_starved()
        self.paused.extend(self.running)    # everyone is preemptible at an iteration boundary
        self.running = []
        batch = self.new_batch()
        evicted: set[int] = set()
        gate = self._host_nearly_full()
        for req in sorted((*self.paused, *self.swapped, *self.waiting), key=self._rank):
            if batch.full:
                break
            if gate and req.status is Status.WAITING and not req.num_computed_tokens:
                continue                    # not started: waits for host room, keeps its place
            if req.id not in evicted:
                self._try_run(batch, req, evicted)
        # charged (and demoted) before the proactive swaps rank the paused jobs; the time
        # charged is the step's compute and critical-path swaps (the overlapped ones rarely
        # outlast it)
        self._account(batch, batch.freeze())
        if self.params.proactive_swap:
            self._proactive(batch)
        return batch.freeze()

    def _host_nearly_full(self) -> bool:
        """The artifact's admission gate: with less than ``host_free_fraction`` of the host's
        swap blocks free, a job still in its first (context) iteration is not started, so the
        jobs already started can be swapped out instead of dropped. Without swap space (no
        host blocks) there is nothing to protect."""
        host = self.blocks.num_host_blocks
        return bool(host) and self.blocks.num_host_free < self.params.host_free_fraction * host

    def _proactive(self, batch: Batch) -> None:
        """The artifact's reserve_free_blocks, on a side stream: swap out paused jobs (lowest
        priority first) until ``reserve`` blocks are free; if none had to go, swap in the
        best-ranked swapped jobs that fit above the reserve."""
        blocks, p = self.blocks, self.params
        reserve = self.limits.max_num_seqs if p.reserve_blocks is None else p.reserve_blocks
        moved = 0
        for req in sorted(self.paused, key=self._rank, reverse=True):
            if blocks.num_free >= reserve:
                break
            n = blocks.swap_out(req.id)
            if n is None:                   # no host room: leave it resident
                break
            self.paused.remove(req)
            req.num_preemptions += 1
            batch.num_preempted += 1
            req.status = Status.SWAPPED
            self.swapped.append(req)
            batch.swap_out_blocks += n
            moved += n
        if not moved:
            for req in sorted(self.swapped, key=self._rank)[:self.limits.max_num_seqs]:
                if blocks.swapped_blocks(req.id) + reserve > blocks.num_free:
                    break
                n = blocks.swap_in(req.id)
                assert n is not None            # checked to fit just above
                self.swapped.remove(req)
                req.status = Status.RUNNING     # resident, paused like a preempted job
                self.paused.append(req)
                batch.swap_in_blocks += n
                moved += n
        batch.overlapped_swap_blocks += moved

    def _rank(self, req: Request) -> tuple[int, int]:
        return self.level[req.id], self.seq[req.id]

    def _try_run(self, batch: Batch, req: Request, evicted: set[int]) -> None:
        """Run ``req`` this iteration if its tokens fit the budget and its KV fits the device,
        evicting paused jobs of lower priority (lowest first) to make room."""
        n = req.num_remaining
        if n > batch.token_budget:
            return
        if req.status is Status.SWAPPED:
            need = self.blocks.blocks_for(req.num_computed_tokens + n)
        else:
            need = self.blocks.num_new_blocks(req.id, req.num_computed_tokens + n)
        if need > self.blocks.num_free and not self._make_room(batch, req, need, evicted):
            return
        if req.status is Status.SWAPPED:
            moved = self.blocks.swap_in(req.id)
            assert moved is not None            # room was made above
            batch.swap_in_blocks += moved
            self.swapped.remove(req)
        elif req.status is Status.WAITING:
            self.waiting.remove(req)
        else:
            self.paused.remove(req)
        self.blocks.allocate(req.id, req.num_computed_tokens + n)
        req.status = Status.RUNNING
        self.running.append(req)
        batch.add(req, n)

    def _make_room(self, batch: Batch, req: Request, need: int, evicted: set[int]) -> bool:
        """Evict paused jobs ranked below ``req``, lowest first, until ``need`` blocks are
        free; False (and nothing evicted) if even all of them would not make room."""
        rank = self._rank(req)
        victims = sorted((r for r in self.paused if self._rank(r) > rank), key=self._rank,
                         reverse=True)
        if need > self.blocks.num_free + sum(self.blocks.held(r.id) for r in victims):
            return False
        for victim in victims:
            if need <= self.blocks.num_free:
                break
            self._evict(batch, victim)
            evicted.add(victim.id)
        return True

    def _evict(self, batch: Batch, req: Request) -> None:
        self.paused.remove(req)
        req.num_preemptions += 1
        batch.num_preempted += 1
        moved = self.blocks.swap_out(req.id)
        if moved is not None:
            req.status = Status.SWAPPED
            self.swapped.append(req)
            batch.swap_out_blocks += moved
            return
        self.blocks.free(req.id)            # no host room: recompute later
        req.num_computed_tokens = 0
        req.status = Status.WAITING
        self.waiting.append(req)

    def _account(self, batch: Batch, plan: StepPlan) -> None:
        """Charge every job that ran: the iteration's time (priced as the engine prices it)
        or one iteration; demote those past their quantum (time: strictly past it, as the
        artifact's ``get_process_time() > quantum``; iterations: on reaching it)."""
        last = self.params.num_queues - 1
        if self.timed:
            if not batch.entries:
                return
            cost = float(self._latency().step_time(plan))
            for req, _ in batch.entries:
                self.used[req.id] += cost
                level = self.level[req.id]
                if self.used[req.id] > self.quantum(level) and level < last:
                    self._enqueue(req, level + 1, front=True)
            return
        for req, _ in batch.entries:
            self.last_run[req.id] = self.step
            self.used[req.id] += 1
            level = self.level[req.id]
            if self.used[req.id] >= self.quantum(level) and level < last:
                self._enqueue(req, level + 1)

    def _promote_starved(self) -> None:
        p: FastServeParams = self.params
        if self.timed:
            if self.step % p.starvation_period:
                return
            limit, now = p.starvation_ms / 1e3, self.now
        else:
            limit, now = float(p.starvation_steps), float(self.step)
        if not limit:
            return
        for req in (*self.paused, *self.swapped, *self.waiting):
            if now - self.last_run[req.id] >= limit and self.level[req.id] > 0:
                self._enqueue(req, 0)
                self.last_run[req.id] = now

    def complete(self, plan: StepPlan, t_end: float) -> list[Request]:
        self._before, self.now = self.now, t_end
        if self.timed:
            for rid in plan.request_ids:
                self.last_run[rid] = t_end
        finished = super().complete(plan, t_end)
        for req in finished:
            for table in (self.level, self.used, self.seq, self.last_run):
                del table[req.id]
        return finished
