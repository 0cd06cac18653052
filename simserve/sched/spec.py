"""Speculative decoding: vLLM 0.32's ``speculative_config`` knobs and its synthetic acceptance
model (issue #18).

vLLM (``config/speculative.py``, ``v1/sample/rejection_sampler.py``) can accept draft tokens
synthetically: ``synthetic_acceptance_rates`` are per-position *unconditional* rates ``p_i``
(the probability that the first i+1 drafts are all accepted; length k, each in [0, 1],
non-increasing), or ``synthetic_acceptance_length`` ``L`` in [1, k+1] is turned into rates by
the minimum-variance schedule ``[1]·⌊L−1⌋ + [frac] + [0]…``. Draft i is accepted with the
conditional probability ``p_i / p_{i−1}`` once every earlier draft was. simserve uses the same
names and semantics, so a vLLM run with the same rates is a like-for-like reference for the
scheduler and the metrics (no draft-model quality involved).

A verify step schedules ``1 + d`` tokens for a decoding request (its last sampled token and
``d <= k`` drafts, fewer when the token budget runs out, as vLLM clips them); the step outputs
``a + 1`` tokens, ``a`` the drafts accepted. The draw is a pure function of (seed, request,
position), so a request's acceptances do not depend on what else shares its batches.

KV lookahead (vLLM ``num_lookahead_tokens``): EAGLE, EAGLE3, MTP and draft-model proposers
write KV for ``k`` positions beyond the verified ones, so a verify step needs blocks for
``computed + (1 + d) + k`` tokens; n-gram needs none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simserve.errors import ConfigError
from simserve.fields import Fields

METHODS = ("eagle", "eagle3", "mtp", "draft_model", "ngram")
_LOOKAHEAD = {"eagle": True, "eagle3": True, "mtp": True, "draft_model": True, "ngram": False}
MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SpeculativeConfig:
    """``engine.speculative_config`` (vLLM's names). ``model``: the drafter's card for
    ``draft_model`` (a shipped name or inline card); EAGLE/EAGLE3 heads are priced as one
    dense decoder layer of the target's shapes and MTP as one layer of the target itself,
    both labelled assumptions (docs/models.md)."""

    method: str
    num_speculative_tokens: int
    acceptance_rates: tuple[float, ...]          # unconditional p_1 .. p_k, resolved
    synthetic_acceptance_rates: tuple[float, ...] | None = None
    synthetic_acceptance_length: float | None = None
    # simserve's own: a measured distribution of drafts accepted per verify, P(a = 0 .. k)
    acceptance_distribution: tuple[float, ...] | None = None
    model: object = None                         # draft_model: its ModelCard
    prompt_lookup_min: int | None = None         # ngram: recorded, no effect on cost
    prompt_lookup_max: int | None = None

    @property
    def k(self) -> int:
        return self.num_speculative_tokens

    @property
    def lookahead(self) -> int:
        """KV slots written beyond the verified tokens each step (vLLM num_lookahead_tokens)."""
        return self.k if _LOOKAHEAD[self.method] else 0

    @property
    def conditional(self) -> tuple[float, ...]:
        """Probability that draft i is accepted given drafts 1..i−1 were: p_i / p_{i−1}."""
        out, prev = [], 1.0
        for p in self.acceptance_rates:
            out.append(p / prev if prev > 0 else 0.0)
            prev = p
        return tuple(out)

    @property
    def mean_acceptance_length(self) -> float:
        """Expected tokens per verify step with all k drafts scheduled: 1 + Σ p_i."""
        return 1.0 + sum(self.acceptance_rates)

    @classmethod
    def from_fields(cls, f: Fields) -> SpeculativeConfig:
        method = f.str("method", choices=METHODS)
        k = f.int("num_speculative_tokens", min=1, max=64)
        rates = f.any("synthetic_acceptance_rates", None)
        length = f.float("synthetic_acceptance_length", None)
        dist = f.any("acceptance_distribution", None)
        where_r, where_l = f.where("synthetic_acceptance_rates"), f.where(
            "synthetic_acceptance_length")
        if sum(x is not None for x in (rates, length, dist)) != 1:
            raise ConfigError(f.path, "give exactly one of synthetic_acceptance_rates or "
                                      "synthetic_acceptance_length (vLLM's synthetic rejection "
                                      "sampling; simserve samples no draft model), or "
                                      "acceptance_distribution (simserve's own)")
        if dist is not None:
            resolved = _rates_from_distribution(dist, k, f.where("acceptance_distribution"))
        elif rates is not None:
            if not isinstance(rates, list) or len(rates) != k:
                raise ConfigError(where_r, f"must be a list of num_speculative_tokens = {k} "
                                           f"rates, got {rates!r}")
            for i, r in enumerate(rates):
                if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
                    raise ConfigError(f"{where_r}[{i}]", f"must be in [0, 1], got {r!r}")
            if any(rates[i] > rates[i - 1] for i in range(1, k)):
                raise ConfigError(where_r, f"must be non-increasing (unconditional rates: "
                                           f"position i needs every earlier one), got {rates}")
            resolved = tuple(float(r) for r in rates)
        if length is not None:
            if not 1.0 <= length <= k + 1:
                raise ConfigError(where_l, f"must be in [1, {k + 1}], got {length:g}")
            drafts = length - 1
            full = int(drafts)
            resolved = tuple(([1.0] * full + [drafts - full] + [0.0] * k)[:k])
        model = f.any("model", None)
        if model is not None:
            from simserve.cards import load_model
            model = load_model(model, f.where("model"))
        if method == "draft_model" and model is None:
            raise ConfigError(f.where("model"), "method draft_model needs the draft model's "
                                                "card (a shipped name or a mapping)")
        lo = f.int("prompt_lookup_min", None, min=1, max=64)
        hi = f.int("prompt_lookup_max", None, min=1, max=64)
        if method != "ngram" and (lo is not None or hi is not None):
            raise ConfigError(f.where("prompt_lookup_min" if lo is not None
                                      else "prompt_lookup_max"), "is an ngram knob")
        if lo is not None and hi is not None and lo > hi:
            raise ConfigError(f.where("prompt_lookup_min"), f"must be <= prompt_lookup_max "
                                                            f"({hi}), got {lo}")
        f.done()
        return cls(method, k, resolved,
                   tuple(float(r) for r in rates) if rates is not None else None,
                   length, tuple(float(x) for x in dist) if dist is not None else None,
                   model, lo, hi)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.k}
        if self.synthetic_acceptance_rates is not None:
            out["synthetic_acceptance_rates"] = list(self.synthetic_acceptance_rates)
        elif self.acceptance_distribution is not None:
            out["acceptance_distribution"] = list(self.acceptance_distribution)
        else:
            out["synthetic_acceptance_length"] = self.synthetic_acceptance_length
        if self.model is not None:
            card: Any = self.model          # a ModelCard (typed object: cards imports this)
            out["model"] = card.to_dict()
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def _rates_from_distribution(dist: Any, k: int, where: str) -> tuple[float, ...]:
    """Unconditional per-position rates from a measured distribution of drafts accepted per
    verify step with all k drafts, ``P(a = 0), …, P(a = k)``: ``p_i = P(a > i)`` (the same
    draws, so vLLM's synthetic sampler with these rates reproduces the distribution)."""
    if not isinstance(dist, list) or len(dist) != k + 1:
        raise ConfigError(where, f"must be a list of num_speculative_tokens + 1 = {k + 1} "
                                 f"probabilities P(0 accepted) .. P({k} accepted), got {dist!r}")
    for i, x in enumerate(dist):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= 1:
            raise ConfigError(f"{where}[{i}]", f"must be in [0, 1], got {x!r}")
    total = float(sum(dist))
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(where, f"probabilities must sum to 1, got {total:g}")
    return tuple(min(1.0, max(0.0, float(sum(dist[i + 1:])))) for i in range(k))


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of ``x``."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class Acceptance:
    """Draws how many of a verify step's drafts are accepted, deterministically per
    (seed, request id, position of the verified token): the same request accepts the same
    drafts whatever batches it shares and however the run is stepped."""

    def __init__(self, cfg: SpeculativeConfig, seed: int):
        self.cfg = cfg
        self.conditional = cfg.conditional
        self._seed = _mix(seed & MASK64)

    def accepted(self, request_id: int, position: int, drafts: int) -> int:
        """Drafts accepted (0 .. ``drafts``) for the verify at ``position`` (tokens computed
        before the step)."""
        h = _mix(self._seed ^ _mix((request_id << 32) ^ position))
        for i in range(drafts):
            c = self.conditional[i]
            if c >= 1.0:
                continue
            h = _mix(h + i + 1)
            if (h >> 11) * (1.0 / (1 << 53)) >= c:
                return i
        return drafts
