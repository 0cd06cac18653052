"""Speculative decoding in the scheduler: a decode becomes a verify of up to ``k`` drafts, its KV
holds ``k`` lookahead slots, and ``complete`` accepts drafts as sched/spec.py draws them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simserve.sched.batch import Batch, SchedulerLimits
from simserve.sched.request import Request
from simserve.sched.spec import Acceptance, SpeculativeConfig


class Verifying:
    """The scheduler's verbs for speculative verifies (a part of ``Scheduler``, sched/core.py)."""

    # what they read and write of the scheduler's state (sched/core.py sets it)
    limits: SchedulerLimits
    running: list[Request]
    sampled: list[Request]
    sampled_tokens: list[int] | None
    speculative: SpeculativeConfig | None
    acceptance: Acceptance | None
    _lookahead: int

    if TYPE_CHECKING:
        def clip(self, req: Request, n: int, batch: Batch) -> int: ...

        def grow_or_preempt(self, batch: Batch, req: Request, n: int) -> bool: ...

        def retire(self, finished: list[Request], t: float | None) -> None: ...

    def verify_tokens(self, batch: Batch, req: Request, n: int) -> int:
        """A decode's tokens with speculation: its last sampled token and up to k drafts,
        fewer when the token budget (or max_model_len) runs out, as vLLM clips them."""
        if n != 1 or not req.is_decoding:
            return n
        assert self.speculative is not None     # (called only when speculating)
        drafts = min(self.speculative.k, batch.token_budget - 1)
        if self.limits.max_model_len:
            drafts = min(drafts, self.limits.max_model_len - req.num_tokens)
        return 1 + max(0, drafts)

    def slots(self, req: Request, n: int) -> int:
        """Tokens whose KV a request must hold to compute ``n`` more: with EAGLE/MTP/draft
        proposers, ``k`` lookahead slots beyond them (vLLM's num_lookahead_tokens), capped
        at max_model_len::

            computed | n scheduled (1 + drafts) | lookahead k |
            [x x x x | v d d d                  | l l l       ]   blocks cover all of it
        """
        return self._with_lookahead(req.num_computed_tokens + n)

    def _with_lookahead(self, need: int) -> int:
        if self._lookahead:
            cap = self.limits.max_model_len or need + self._lookahead
            need = max(need, min(need + self._lookahead, cap))
        return need

    def _decode_all_verifying(self, batch: Batch) -> bool:
        """``decode_all`` with speculative decoding: each request through
        ``grow_or_preempt`` (which makes a decode a verify of its drafts)."""
        i = 0
        while i < len(self.running):
            if batch.token_budget <= 0 or batch.seq_budget <= 0:
                return True
            req = self.running[i]
            n = 1 if req.is_decoding else self.clip(req, req.num_remaining, batch)
            if not self.grow_or_preempt(batch, req, n):
                return False
            i += 1
        return True

    def _complete_verifying(self, entries: list[tuple[Request, int]],
                            t_end: float) -> list[Request]:
        """``complete`` with speculative decoding. A decode that fed ``1 + d`` tokens accepts
        ``a <= d`` drafts (sched/spec.py): its KV keeps ``1 + a`` of them (the rejected drafts'
        slots are rolled back, their blocks kept), and it outputs ``a + 1`` tokens, trimmed
        at its output length (vLLM's stop check after each token)."""
        finished: list[Request] = []
        sampled, counts = self.sampled, []
        accept = self.acceptance
        assert accept is not None               # (set whenever speculating)
        for req, n in entries:
            computed = req.num_computed_tokens
            if req.num_generated and computed + 1 == req.num_prompt_tokens + req.num_generated:
                drafts = n - 1
                a = accept.accepted(req.id, computed, drafts) if drafts else 0
                if drafts:
                    req.num_drafts += 1
                    req.num_draft_tokens += drafts
                    req.num_accepted_tokens += a
                    if a:
                        per = req.accepted_per_position
                        if per is None:
                            assert self.speculative is not None
                            per = req.accepted_per_position = [0] * self.speculative.k
                        for i in range(a):
                            per[i] += 1
                req.num_computed_tokens = computed + 1 + a
                out = min(a + 1, req.num_output_tokens - req.num_generated)
            else:
                req.num_computed_tokens = computed + n
                if req.num_computed_tokens != req.num_prompt_tokens + req.num_generated:
                    continue
                out = 1
            req.num_generated += out
            sampled.append(req)
            counts.append(out)
            if req.num_generated >= req.num_output_tokens:
                finished.append(req)
        self.sampled_tokens = counts
        self.retire(finished, t_end)
        return finished
