"""StepPlan: the one frozen record of what a replica computes in one engine iteration.

The scheduler produces it; the step-latency model prices it; the recorder logs it. Nothing
downstream of the scheduler sees requests or queues, only this record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class StepPlan(NamedTuple):
    """Work of one iteration. Immutable (a named tuple: built several times per simulated
    boundary, it costs a quarter of a frozen dataclass); ``plan._replace(field=...)`` makes
    a changed copy.

    A request's tokens are "prefill" when they are (part of) a catch-up of its KV cache: the prompt,
    or the prompt plus already generated tokens after a recompute preemption. They are "decode"
    when the request feeds back exactly its last sampled token (``num_computed + 1 == num_tokens``),
    with speculative decoding followed by the drafts it verifies (``decode_q``).

    Invariants (checked by the property tests):
      * ``len(prefill_lens) == len(prefill_ctx)``; every prefill length >= 1
      * ``num_batched_tokens = sum(prefill_lens) + sum(decode_q) (or len(decode_ctx)) <=
        max_num_batched_tokens``
        (static batching is the one policy allowed to exceed it, with its whole-prompt prefill)
      * ``num_seqs = len(prefill_lens) + len(decode_ctx) <= max_num_seqs``
    """

    # request ids scheduled this step, in schedule order, and their new-token counts
    request_ids: tuple[int, ...]
    num_new_tokens: tuple[int, ...]
    # prefill chunks: query length and the context already in KV before the chunk
    prefill_lens: tuple[int, ...]
    prefill_ctx: tuple[int, ...]
    # decode sequences: tokens already in KV before this step (the new token attends ctx + 1)
    decode_ctx: tuple[int, ...]
    # requests whose next token is sampled at the end of this step (prefill done or decoding)
    num_sampled: int
    # KV blocks moved between device and host memory in this step (swap preemption)
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    # requests preempted while forming this plan (recompute or swap)
    num_preempted: int = 0
    # seconds the step costs beyond its tokens (a policy's own scheduling overhead, e.g. the
    # LMDeploy-style reschedule cost); every latency model adds it to the step's time
    extra_s: float = 0.0
    # speculative decoding (#18): query tokens of each decode sequence, in decode_ctx order
    # (1 + the drafts it verifies); empty when every decode feeds one token (no speculation)
    decode_q: tuple[int, ...] = ()
    # rows a padded batch computes beyond the real ones (static batching: finished members keep
    # their row until the batch ends), each a decode at the step's longest decode context;
    # priced by the latency models, never counted as work (num_batched_tokens excludes them)
    padding: int = 0
    # of the swapped blocks above, those moved on a separate stream while this step computes
    # (FastServe's proactive swaps): they cost only what they outlast the step by
    overlapped_swap_blocks: int = 0

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill_lens)

    @property
    def num_decode_seqs(self) -> int:
        return len(self.decode_ctx)

    @property
    def num_decode_tokens(self) -> int:
        """Tokens the decode sequences feed: one each, or 1 + drafts when verifying."""
        return sum(self.decode_q) if self.decode_q else len(self.decode_ctx)

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_lens) + len(self.decode_ctx)

    @property
    def padded_ctx(self) -> tuple[int, ...]:
        """The decode contexts the device computes: the real ones, then ``padding`` rows at
        the longest of them."""
        if not self.padding or not self.decode_ctx:
            return self.decode_ctx
        return self.decode_ctx + (max(self.decode_ctx),) * self.padding

    def as_computed(self) -> StepPlan:
        """The plan the device computes: ``padding`` rows made real decodes at the longest
        context (each feeding one token and scoring one row); the plan itself when unpadded.
        What every latency model prices."""
        if not self.padding:
            return self
        return self._replace(decode_ctx=self.padded_ctx, padding=0,
                             num_sampled=self.num_sampled + self.padding,
                             decode_q=self.decode_q + (1,) * self.padding if self.decode_q
                             else ())

    @property
    def is_empty(self) -> bool:
        return not self.request_ids and not self.swap_out_blocks and not self.swap_in_blocks


# ``(i, n) -> list``: the seconds of steps i .. i + n - 1 of a decode stretch (step i: every
# context grown by i), as a latency model prices them for fast-forward (sched/stretch.py)
Prices = Callable[[int, int], list[float]]
