"""S3: reserve KV for a *predicted* output length instead of the maximum, so more requests fit.

From the S3 paper (Jin et al., "S³: Increasing GPU Utilization during Generative Inference for
Higher Throughput", NeurIPS'23): a predictor guesses each request's output length; the scheduler
admits requests while the KV for prompt + predicted output fits, where systems that cannot know
the length reserve the maximum; a supervisor preempts a request that outgrows its reservation
and re-queues it with a larger prediction. Batches are formed ORCA-style: iteration-level,
whole prompts joining the running decodes.

The predictor is an oracle with a configurable error, drawn per request from its own stream
(``SeedSequence(seed, spawn_key=(4, request_id))``: the scenario seed's fifth child, streams
0-2 being the workload's and 3 the request classes'), so a prediction depends only on the seed
and the request, never on routing or timing::

    exact      predicted = true output length
    lognormal  predicted = true · exp(N(0, error_sigma))       (median-unbiased)
    normal     predicted = true · (1 + N(0, error_sigma))

rounded up to a multiple of ``bucket_tokens`` (S3 classifies into length buckets; 0 = none),
at least 1. A request that outgrows its reservation (``misprediction: preempt``, the paper's
supervisor) is preempted (recompute), its prediction raised to the next bucket (doubled without
buckets), and it goes back to the queue head; with ``misprediction: extend`` its reservation
grows by that much in place when the blocks are free, and it is preempted only when they are not.

Not modelled: the DistilBERT predictor itself (its accuracy is the error knob), S3's
decreasing-first-fit packing of requests across GPUs (one replica admits FCFS), and the
predictor's online retraining.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simserve.sched.batch import Batch
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
from simserve.sched.params import knob
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status

ORACLE_STREAM = 4   # child of the root SeedSequence (0-2: workload streams, 3: classes)
ERROR_DISTS = ("exact", "lognormal", "normal")
ON_MISPREDICTION = ("preempt", "extend")


@dataclass(frozen=True)
class S3Params:
    error_dist: str = knob("exact", choices=ERROR_DISTS)
    error_sigma: float = knob(0.5, min=0.0, max=10.0)      # e^±30 beyond that
    bucket_tokens: int = knob(0, min=0)
    misprediction: str = knob("preempt", choices=ON_MISPREDICTION)


class S3(Scheduler):
    name = "s3"
    # a request outgrowing its reservation is preempted, not grown: every step is scheduled
    facts = PolicyFacts(chunked=False, params_type=S3Params, monotone_admission=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.predicted: dict[int, int] = {}   # request id -> predicted output tokens

    def add(self, req: Request) -> None:
        super().add(req)
        self.predicted[req.id] = self.predict(req)

    def predict(self, req: Request) -> int:
        p = self.params
        true = req.num_output_tokens
        if p.error_dist == "exact":
            guess = float(true)
        else:
            rng = np.random.default_rng(
                np.random.SeedSequence(self.seed, spawn_key=(ORACLE_STREAM, req.id)))
            z = rng.normal(0.0, p.error_sigma)
            guess = true * (math.exp(z) if p.error_dist == "lognormal" else 1.0 + z)
        return self._bucket(max(1, math.ceil(guess)))

    def _bucket(self, tokens: int) -> int:
        b = self.params.bucket_tokens
        return -(-tokens // b) * b if b else tokens

    def reservation(self, req: Request) -> int:
        """Tokens of KV reserved at admission: prompt + predicted output, capped at the cache."""
        cap = self.blocks.num_blocks * self.blocks.block_size
        return max(req.num_tokens, min(req.num_prompt_tokens + self.predicted[req.id], cap))

    def schedule(self) -> StepPlan:
        batch = self.new_batch()
        for req in list(self.running):
            if batch.full:
                break
            n = req.num_remaining
            if self.blocks.num_new_blocks(req.id, req.num_computed_tokens + n) \
                    and not self._extended(req):
                self._mispredicted(batch, req)     # outgrew its reservation
            else:
                self.grow(batch, req, n)
        while self.may_admit(batch):
            req = self.waiting[0]
            n = req.num_remaining
            if n > batch.token_budget \
                    or not self.admit(batch, req, n, reserve_tokens=self.reservation(req)):
                break
        return batch.freeze()

    def _next_prediction(self, req: Request) -> int:
        b, old = self.params.bucket_tokens, self.predicted[req.id]
        return max(old + b if b else 2 * old, req.num_generated + 1)

    def _extended(self, req: Request) -> bool:
        """``misprediction: extend``: grow the reservation in place if its blocks are free."""
        if self.params.misprediction != "extend":
            return False
        predicted = self._next_prediction(req)
        if self.blocks.allocate(req.id, min(req.num_prompt_tokens + predicted,
                                            self.blocks.num_blocks * self.blocks.block_size)) \
                is None:
            return False
        self.predicted[req.id] = predicted
        return True

    def _mispredicted(self, batch: Batch, req: Request) -> None:
        """The supervisor: preempt (recompute), raise the prediction, back to the queue head."""
        self.predicted[req.id] = self._next_prediction(req)
        self.running.remove(req)
        self.blocks.free(req.id)
        req.num_preemptions += 1
        batch.num_preempted += 1
        req.num_computed_tokens = 0
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    def complete(self, plan: StepPlan, t_end: float) -> list[Request]:
        finished = super().complete(plan, t_end)
        for req in finished:
            del self.predicted[req.id]
        return finished
