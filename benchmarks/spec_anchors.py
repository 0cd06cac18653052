"""Speculative-decoding anchors (issue #18), paper vs simserve; run by
``benchmarks/moe_anchors.py --spec`` or on its own.

1. Tokens per verify step: with i.i.d. per-token acceptance α and k drafts the expected
   tokens per step are (1 − α^(k+1)) / (1 − α) (the standard derivation, e.g. Leviathan et
   al. 2023). simserve, given vLLM's synthetic rates [α, α², …, α^k], measures the acceptance
   length over a run (vLLM's definition: 1 + accepted / drafts).
2. DeepSeek-V3 MTP (k = 1): the V3 report's "acceptance rate of the second token prediction
   ranges between 85% and 90% … 1.8 times TPS". simserve: DeepSeek-V3 on 8 H200s (TP 8 +
   expert parallelism, FP8 checkpoint), a light load, the mean decode speed (1 / TPOT) with
   MTP (rate 0.85 and 0.90) over without. The paper's hardware is H800 and its serving stack
   DeepSeek's own: a like-for-like comparison of the ratio, not of absolute speeds.
"""

from __future__ import annotations

import copy

from simserve.config import parse_scenario
from simserve.runner import run

TINY = {"name": "accept", "seed": 3, "model": "tiny-llama-45m", "hardware": "H100-SXM",
        "engine": {"num_gpu_blocks": 4096, "max_model_len": 2048, "max_num_seqs": 64},
        "latency": {"model": "constant", "step_ms": 10},
        "workload": {"num_requests": 200, "rate": 50, "prompt": {"dist": "fixed", "value": 64},
                     "output": {"dist": "fixed", "value": 400}}}

DSV3 = {"name": "dsv3-mtp", "seed": 0, "model": "DeepSeek-V3", "hardware": "H200",
        "engine": {"tensor_parallel_size": 8, "enable_expert_parallel": True,
                   "max_model_len": 8192, "max_num_batched_tokens": 8192},
        "latency": {"model": "roofline"},
        "workload": {"num_requests": 40, "rate": 0.5,
                     "prompt": {"dist": "fixed", "value": 1000},
                     "output": {"dist": "fixed", "value": 500}}}


def _with_spec(raw: dict, cfg: dict | None) -> dict:
    out = copy.deepcopy(raw)
    if cfg is not None:
        out["engine"]["speculative_config"] = cfg
    return out


def spec_anchors() -> None:
    print("\nTokens per verify step, i.i.d. acceptance α (closed form vs simserve's run)")
    print(f"{'α':>5} {'k':>3} {'closed form':>12} {'simserve':>9} {'drafts':>8}")
    for alpha in (0.6, 0.8, 0.9):
        for k in (1, 3, 5):
            rates = [alpha ** (i + 1) for i in range(k)]
            cfg = {"method": "eagle", "num_speculative_tokens": k,
                   "synthetic_acceptance_rates": rates}
            sd = run(parse_scenario(_with_spec(TINY, cfg))).summary["spec_decode"]
            want = (1 - alpha ** (k + 1)) / (1 - alpha)
            print(f"{alpha:>5} {k:>3} {want:>12.3f} {sd['acceptance_length']:>9.3f} "
                  f"{sd['num_drafts']:>8}")
    print("\nDeepSeek-V3 MTP, k = 1 (paper: acceptance 85-90 %, \"1.8 times TPS\")")
    base = run(parse_scenario(DSV3)).summary
    print(f"without MTP: mean TPOT {base['mean_tpot_ms']:.2f} ms  "
          f"({1000 / base['mean_tpot_ms']:.1f} tok/s per request)")
    for p in (0.85, 0.90):
        cfg = {"method": "mtp", "num_speculative_tokens": 1, "synthetic_acceptance_rates": [p]}
        s = run(parse_scenario(_with_spec(DSV3, cfg))).summary
        print(f"MTP at {p:.2f}: mean TPOT {s['mean_tpot_ms']:.2f} ms, acceptance length "
              f"{s['spec_decode']['acceptance_length']:.3f}, speed-up "
              f"{base['mean_tpot_ms'] / s['mean_tpot_ms']:.2f}x (paper: 1.8x)")


if __name__ == "__main__":
    spec_anchors()
