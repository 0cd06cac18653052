"""Writes ``distserve_lengths.csv``: (prompt, output) pairs drawn like DistServe's chatbot requests.

DistServe's chatbot workload is multi-turn ShareGPT (OPT tokenizer), each pair kept when prompt
+ output < 2048. Its requests are not shipped here; what is, is this draw from a fit to them:
each length by inverse transform from piecewise-linear quantiles measured on the 400 requests of
the artifact's workload (LLMServe/DistServe ``simdistserve/benchmarks/alignment/
data-ground-truth/opt-13b-sharegpt-workload/vllm-400-4.exp``; every smaller run of it replays its
first requests), the two independent (their measured correlation, of prompt and log output, is
-0.09), a pair kept, as DistServe filters, when prompt + output < 2048. Seeded: running this
again writes the same file (a unit test checks).

    python benchmarks/papers/distserve_lengths.py           # (re)writes distserve_lengths.csv

Measured on those 400 requests: prompt mean 763, median 723, 7.7 % above 1,536 tokens, max
2,003; output median 81, mean 176, max 1,085. The draw: prompt mean 752, median 709, 7.5 %
above 1,536; output median 76, mean 169.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "distserve_lengths.csv"
PERCENTILES = (0, 5, 10, 25, 50, 75, 90, 95, 99, 100)
PROMPT = (2, 31, 91, 334, 723, 1147, 1512, 1696, 1889, 2003)      # tokens at those percentiles
OUTPUT = (2, 6, 9, 18, 81, 292, 477, 561, 829, 1085)
PAIRS, SEED, MAX_TOTAL = 4000, 2024, 2048


def draw() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    prompts: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    while sum(map(len, prompts)) < PAIRS:
        p = np.rint(np.interp(rng.uniform(0, 100, PAIRS), PERCENTILES, PROMPT)).astype(int)
        o = np.rint(np.interp(rng.uniform(0, 100, PAIRS), PERCENTILES, OUTPUT)).astype(int)
        keep = p + o < MAX_TOTAL
        prompts.append(p[keep])
        outputs.append(o[keep])
    return np.concatenate(prompts)[:PAIRS], np.concatenate(outputs)[:PAIRS]


def text() -> str:
    p, o = draw()
    return "prompt_tokens,output_tokens\n" + "".join(f"{a},{b}\n" for a, b in zip(p, o))


if __name__ == "__main__":
    OUT.write_text(text(), encoding="utf-8")
    p, o = draw()
    print(f"{OUT.name}: {len(p)} pairs; prompt mean {p.mean():.0f}, median {np.median(p):.0f}, "
          f"{(p > 1536).mean():.1%} above 1,536; output median {np.median(o):.0f}, "
          f"mean {o.mean():.0f}")
