"""RooflineModel's fast-forward pricing: copies of its step pricing (``latency/roofline.py``,
``_parts`` and ``_curve_parts``) that price a whole decode stretch at once. Each copy must give
values bit-identical to ``step_time`` of every step it prices (the property tests hold
fast-forwarded runs to stepped ones): change a term there, change it here."""

from __future__ import annotations

import math
from bisect import bisect_right
from functools import partial

from simserve.sched.plan import StepPlan

# entries a memo of prefill chunk prices holds before it starts over (bounds its memory)
MEMO_MAX = 1 << 16


class RooflineStretchPricing:
    """The stretch pricing of :class:`~simserve.latency.roofline.RooflineModel` (its base
    class: the methods read the model's per-token rates and call its step terms)."""

    def decode_stretch(self, plan: StepPlan):
        """Prices of a decode stretch starting with ``plan`` (step i: every context grown by
        i): a function ``(i, n) -> list`` of the ``step_time`` of steps i .. i + n - 1.
        Mirrors ``_parts`` (``_curve_parts``) operation for operation, so each value is
        bit-identical to ``step_time`` of that step (fast-forward relies on it)."""
        if plan.decode_q:        # a verify step: its queries change from step to step
            return lambda i, n: [self.step_time(plan)] if (i, n) == (0, 1) else _no_stretch()
        if plan.padding or plan.overlapped_swap_blocks:    # rare shapes: step by step
            return self._stepwise(plan)
        b = len(plan.decode_ctx)
        if self.curves is not None:
            if not (plan.prefill_lens or plan.swap_in_blocks or plan.swap_out_blocks
                    or plan.num_sampled != b or plan.extra_s):
                # a plain decode step: _curve_parts' terms are the sum's (swap 0 * rate = 0.0)
                return self._curve_stretch_sum(b, sum(plan.decode_ctx))
            return self._curve_stretch(plan)
        if not (plan.prefill_lens or plan.swap_in_blocks or plan.swap_out_blocks
                or plan.num_sampled != b or plan.extra_s):
            return self.decode_stretch_sum(b, sum(plan.decode_ctx))
        base = sum(plan.decode_ctx) + b    # Σ (c + i) + b = base + b·i: exact integers
        flop_s, kv_s, overhead, extra = (self._dec_flop_s, self._kv_tok_s,
                                         self._cpu_s(plan.num_sampled), plan.extra_s)
        linear, prefill, _, lm_head, comm, swap = self._parts(plan)
        before = linear + prefill          # sum(parts) adds left to right: 0 + linear + ...
        q_part = b * self._q_tok_s

        def prices(i: int, n: int) -> list[float]:
            attended = range(base + b * i, base + b * (i + n), b) if b else [0] * n
            return [(((((before + max(a * flop_s, a * kv_s + q_part)) + lm_head) + comm)
                      + swap) + overhead) + extra for a in attended]

        return prices

    def _stepwise(self, plan: StepPlan):
        def prices(i: int, n: int) -> list[float]:
            return [self.step_time(plan._replace(decode_ctx=tuple(c + k for c in
                                                                  plan.decode_ctx)))
                    for k in range(i, i + n)]
        return prices

    def decode_stretch_sum(self, b: int, total_ctx: int):
        """``decode_stretch`` of a plain decode step of ``b`` requests whose contexts sum to
        ``total_ctx`` (a roofline decode step depends on nothing else), without building the
        plan: what the engine prices a stretch's later segments with."""
        if self.curves is not None:        # (_curve_stretch_sum's memo read here: every
            by_base = self._curve_sum_prices.get(b)    # decode segment of a stretch asks)
            if by_base is not None:
                return partial(by_base, total_ctx + b)
            return self._curve_stretch_sum(b, total_ctx)
        base = total_ctx + b               # Σ (c + i) + b = base + b·i: exact integers
        terms = self._decode_terms.get(b)
        if terms is None:                  # the terms that depend on b alone (memoised)
            linear = self._linear_s(b)
            lm_head = max(b * self._lm_flop_s, self._lm_weight_s + b * self._lm_row_s) \
                if b else 0.0
            comm = b * self._ar_tok_s + self._ar_fixed_s if b else 0.0
            # memory-bound at every context and nothing to add but the LM head: the short
            # formula below gives the same values
            fast = bool(self._kv_tok_s >= self._dec_flop_s and b and not comm)
            terms = self._decode_terms[b] = (linear + 0.0, lm_head, comm, b * self._q_tok_s,
                                             fast)
        before, lm_head, comm, q_part, fast = terms
        flop_s, kv_s, overhead = self._dec_flop_s, self._kv_tok_s, self._cpu_s(b)

        if fast:
            # the usual decode step, in fewer operations but the same values: a·kv_s + q_part
            # >= a·flop_s for every a (kv_s >= flop_s; rounding is monotone), so max() picks
            # its second term, and x + 0.0 is x for any x >= 0
            def prices(i: int, n: int) -> list[float]:
                return [((before + (a * kv_s + q_part)) + lm_head) + overhead
                        for a in range(base + b * i, base + b * (i + n), b)]
        else:
            def prices(i: int, n: int) -> list[float]:
                attended = range(base + b * i, base + b * (i + n), b) if b else [0] * n
                return [((((before + max(a * flop_s, a * kv_s + q_part)) + lm_head) + comm)
                         + 0.0) + overhead for a in attended]

        return prices

    def mixed_step_sum(self, b: int, total_ctx: int, prefill_lens: tuple[int, ...],
                       prefill_ctx: tuple[int, ...]) -> float:
        """``step_time`` of a step of ``b`` plain decodes whose contexts sum to ``total_ctx``
        and the prefill chunks ``prefill_lens`` after ``prefill_ctx``, each of which samples
        (their last chunks), without the requests' contexts one by one: a roofline step
        reads the decodes only through their count and context sum, so the plan priced has
        ``b`` decodes of that sum (the same value, bit for bit). What a stretch prices the
        steps at which requests join it with (sched/stretch.py). The usual case, one prompt
        (past its cached prefix) beside the decodes, adds its terms as ``step_time`` does,
        those that depend on (b, chunk, cached prefix) alone memoised."""
        if len(prefill_lens) == 1:
            p, c = prefill_lens[0], prefill_ctx[0]
            n = b + p
            if self.curves is not None:
                # _curve_parts' terms, added as step_time adds them: linear, prefill, decode,
                # LM head (b + 1 rows), all-reduce, swap (none), pointwise; then the overhead
                # and the extra cost (0.0). All but the decode depend on (b, p, c) alone:
                # memoised
                key = (b, p, c)
                terms = self._join_terms.get(key)
                if terms is None:
                    chunks = self._prefill_at
                    prefill = chunks.get((p, c))
                    if prefill is None:
                        prefill = self._curve_chunk_s(p, c)
                        if len(chunks) >= MEMO_MAX:
                            chunks.clear()
                        chunks[p, c] = prefill
                    if len(self._join_terms) >= MEMO_MAX:
                        self._join_terms.clear()
                    terms = self._join_terms[key] = (
                        (0.0 + self._linear_s(n)) + (0.0 + prefill), self._curve_lm_s(b + 1),
                        n * self._ar_tok_s + self._ar_fixed_s, 0 * self._swap_block_s,
                        self._curve_pointwise_s(n))
                head, lm_head, comm, swap, pw = terms
                t = head + self._curve_decode_s(b, total_ctx + b)
                return ((((((t + lm_head) + comm) + swap) + pw) + self._cpu_s(b + 1))
                        + 0.0)
            key = (b, p, c)
            terms = self._join_terms.get(key)
            if terms is None:
                plan = StepPlan((), (), prefill_lens, prefill_ctx, (0,) * b, b + 1)
                parts = self._parts(plan)
                # (parts: linear, prefill, decode, then the rest, added left to right)
                if len(self._join_terms) >= MEMO_MAX:
                    self._join_terms.clear()
                terms = self._join_terms[key] = ((0.0 + parts[0]) + parts[1], parts[3:])
            before, after = terms
            attended = total_ctx + b
            decode = max(attended * self._dec_flop_s,
                         attended * self._kv_tok_s + b * self._q_tok_s) if b else 0.0
            t = before + decode
            for v in after:
                t += v
            return (t + self._cpu_s(b + 1)) + 0.0      # step_time's, its extra cost 0.0
        plan = StepPlan((), (), prefill_lens, prefill_ctx,
                        (total_ctx,) + (0,) * (b - 1) if b else (), b + len(prefill_lens))
        parts = self._parts(plan) if self.curves is None else self._curve_parts(plan)
        return (left_to_right(parts) + self._cpu_s(plan.num_sampled)) + 0.0

    def _curve_stretch(self, plan: StepPlan):
        b = len(plan.decode_ctx)
        linear, prefill, _, lm_head, comm, swap, pw = self._curve_parts(plan)
        before, overhead, extra = linear + prefill, self._cpu_s(plan.num_sampled), plan.extra_s
        base = sum(plan.decode_ctx) + b    # Σ (c + i + 1) = base + b·i: exact integers
        if not b:
            dec = self._curve_decode_s

            def prices(i: int, n: int) -> list[float]:
                return [((((((before + dec(b, base + b * k)) + lm_head) + comm) + swap) + pw)
                         + overhead) + extra for k in range(i, i + n)]

            return prices
        return partial(self._curve_decode_prices(b, before, (lm_head, comm, swap, pw,
                                                             overhead, extra)), base)

    def _curve_stretch_sum(self, b: int, total_ctx: int):
        # a plain decode step: n = b tokens, b rows sampled, no prefill, swap or extra cost
        by_base = self._curve_sum_prices.get(b)
        if by_base is None:                # the terms that depend on b alone (memoised)
            linear = self._linear_s(b)
            lm_head = self._curve_lm_s(b)
            comm = b * self._ar_tok_s + self._ar_fixed_s if b else 0.0
            pw = self._curve_pointwise_s(b)
            before, after = linear + 0.0, (lm_head, comm, 0.0, pw, self._cpu_s(b), 0.0)
            if b:
                by_base = self._curve_decode_prices(b, before, after)
            else:
                def by_base(base: int, i: int, n: int) -> list[float]:
                    return [((((((before + 0.0) + lm_head) + comm) + 0.0) + pw) + overhead)
                            + 0.0 for _ in range(i, i + n)]   # _curve_decode_s(0, ·) = 0.0
                overhead = self._cpu_s(0)
            self._curve_sum_prices[b] = by_base
        return partial(by_base, total_ctx + b)

    def _curve_decode_prices(self, b: int, before: float,
                             after: tuple[float, float, float, float, float, float]):
        """``(base, i, n) -> list``: the prices of steps i .. i + n - 1 of a decode stretch of
        ``b`` (>= 1) sequences whose step k attends ``base + b·k`` tokens in all: ``before`` +
        the decode attention
        (:meth:`_curve_decode_s`) + ``after``'s terms (LM head, all-reduce, swap, pointwise,
        overhead, extra cost), added left to right as ``step_time`` adds them.

        :meth:`_curve_decode_s`, :meth:`_decode_eta`, ``Curve1D.at_log2`` and ``_locate``
        written out in one loop, operation for operation (the same values, bit for bit):
        this runs for every step of every stretch."""
        lm_head, comm, swap, pw, overhead, extra = after
        row = self._decode_rows.get(b)
        if row is None:
            row = self._decode_rows[b] = self.curves.attn_decode.row(b * self._kv_heads)
        xs, ys = row.xs, row.eta
        flop_s, kv_s, q_part = self._dec_flop_s, self._kv_tok_s, b * self._q_tok_s
        log2 = math.log2
        if len(xs) == 1:
            eta0 = ys[0]

            def flat(base: int, i: int, n: int) -> list[float]:
                out = []
                for a in range(base + b * i, base + b * (i + n), b):
                    f, m = a * flop_s, a * kv_s + q_part
                    out.append(((((((before + (m if m > f else f) / eta0) + lm_head) + comm)
                                  + swap) + pw) + overhead) + extra)
                return out

            return flat
        x0, x1, last = xs[0], xs[-1], len(xs) - 2
        terms = [v for v in after if v]
        if kv_s >= flop_s and q_part >= 0 and len(terms) == 3:
            # the usual step, in fewer operations but the same values: memory-bound at every
            # context (a·kv_s + q_part >= a·flop_s, rounding being monotone), and of the
            # terms after the attention only three are not zero (x + 0.0 is x for x > 0);
            # the curve's bracket is kept from step to step (the mean context moves by one
            # token a step) and looked up again only when x leaves it
            t1, t2, t3 = terms
            eta_lo = ys[0] + 0.0 * (ys[1] - ys[0])
            eta_hi = ys[last] + 1.0 * (ys[last + 1] - ys[last])

            kept = [0.0, 0.0, 0.0, 0.0, 0.0]   # (and from call to call: xl, xh, yl, dx, dy)

            def memory_bound(base: int, i: int, n: int) -> list[float]:
                out = []
                xl, xh, yl, dx, dy = kept
                j = -1
                for a in range(base + b * i, base + b * (i + n), b):
                    x = log2(a / b)
                    # (in the bracket first: it lies inside [x0, x1), where x0 itself gives
                    # ys[0] + 0.0 * (ys[1] - ys[0]) either way)
                    if xl <= x < xh:
                        eta = yl + (x - xl) / dx * dy
                    elif x <= x0:
                        eta = eta_lo
                    elif x >= x1:
                        eta = eta_hi
                    else:
                        j = bisect_right(xs, x) - 1
                        xl, xh, yl = xs[j], xs[j + 1], ys[j]
                        dx, dy = xh - xl, ys[j + 1] - yl
                        eta = yl + (x - xl) / dx * dy
                    out.append((((before + (a * kv_s + q_part) / eta) + t1) + t2) + t3)
                if j >= 0:
                    kept[:] = xl, xh, yl, dx, dy
                return out

            return memory_bound

        def prices(base: int, i: int, n: int) -> list[float]:
            out = []
            for a in range(base + b * i, base + b * (i + n), b):
                x = log2(a / b)            # log2(1 + mean context)
                if x <= x0:
                    j, w = 0, 0.0
                elif x >= x1:
                    j, w = last, 1.0
                else:
                    j = bisect_right(xs, x) - 1
                    w = (x - xs[j]) / (xs[j + 1] - xs[j])
                y = ys[j]
                eta = y + w * (ys[j + 1] - y)
                f, m = a * flop_s, a * kv_s + q_part     # max(f, m)
                out.append(((((((before + (m if m > f else f) / eta) + lm_head) + comm) + swap)
                             + pw) + overhead) + extra)
            return out

        return prices




def left_to_right(values: tuple[float, ...]) -> float:
    """The terms of a step added left to right from 0, as the stretch prices add them. (Not
    ``sum()``: from Python 3.12 on it compensates rounding for floats, and a step priced one
    at a time would then differ in its last bit from the same step priced in a stretch.)"""
    t = 0.0
    for v in values:
        t += v
    return t


def _no_stretch():
    raise ValueError("a speculative verify step is priced one step at a time")
