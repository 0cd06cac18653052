"""The cost of chunking a prefill and of mixing a prefill into a decode step, as the latency
models price it, against what the papers measured (issue #17, part 3).

1. **Chunked-prefill overhead** (Sarathi-Serve §5.4.1, Fig. 14; the authors' measured values in
   ``osdi-experiments/figure-9/chunking-overhead.csv``, quoted below): Yi-34B at TP 2 on A100-80GB
   (PCIe), one prompt prefilled in chunks of 512 / 1024 / 2048 tokens, time relative to one
   unchunked prefill. Each chunk is a step of its own (its query attends the KV of every earlier
   chunk: re-read, priced in the attention bytes and, with curves, at the measured efficiency of
   a chunk of that size after that much context); rooflines without the per-step CPU overhead.
   The shipped Llama-3.1-8B H100 profile's own composition gives a measured-kernel reference.
2. **Interference**: a decode batch (32 sequences at context 1024) alone, and with a prefill
   chunk of 512 / 2048 tokens in the same step — how much longer the decodes' step (their TBT)
   becomes. Sarathi-Serve reports hybrid batches raising TBT "up to 28.3x" against a decode-only
   batch (§4.2, Fig. 9, full prompts); DistServe that a 512-token prefill makes a 13B model on
   an A100 "near compute-bound" (§2.1).

    .venv/bin/python benchmarks/chunking_cost.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simserve.cards import load_hardware, load_model  # noqa: E402
from simserve.latency.efficiency import load_curves  # noqa: E402
from simserve.latency.profile import ProfileLatency  # noqa: E402
from simserve.latency.roofline import RooflineModel  # noqa: E402
from simserve.sched.plan import StepPlan  # noqa: E402

# Sarathi-Serve's chunking-overhead.csv (digest papers-17 §2.3): prompt -> chunk -> time / unchunked
SARATHI = {2047: {512: 1.152, 1024: 1.175, 2048: 0.999},
           4095: {512: 1.189, 1024: 1.202, 2048: 1.024},
           8191: {512: 1.117, 1024: 1.109, 2048: 0.937},
           16383: {512: 0.995, 1024: 0.961, 2048: 0.805}}
CHUNKS = (512, 1024, 2048)


def plan(prefill=(), decode=(), sampled=0) -> StepPlan:
    n = len(prefill) + len(decode)
    return StepPlan(tuple(range(n)), tuple(q for q, _ in prefill) + (1,) * len(decode),
                    tuple(q for q, _ in prefill), tuple(c for _, c in prefill), tuple(decode),
                    sampled)


def prefill_time(model, prompt: int, chunk: int) -> float:
    total, done = 0.0, 0
    while done < prompt:
        q = min(chunk, prompt - done)
        total += model.step_time(plan([(q, done)], sampled=int(done + q == prompt)))
        done += q
    return total


def main() -> int:
    yi = load_model("Yi-34B")
    yi = dataclasses.replace(yi, max_position_embeddings=200_000)   # Yi-34B-200K's shapes
    hw = load_hardware("A100-80GB-PCIe")
    models = {
        "roofline, constant 0.6/0.8": RooflineModel(yi, hw, tensor_parallel_size=2,
                                                    step_overhead_s=0.0),
        "roofline, a100 curves": RooflineModel(yi, hw, tensor_parallel_size=2,
                                               step_overhead_s=0.0, curves=load_curves("a100")),
    }
    prof = ProfileLatency(json.loads((ROOT / "simserve/data/profiles/"
                                      "Llama-3.1-8B_H100-SXM_bf16.json").read_text()))
    print("1. Chunked prefill, time relative to unchunked (Yi-34B TP2 on A100-80GB-PCIe; "
          "the profile row: Llama-3.1-8B on its measured H100 kernels)")
    print(f"  {'prompt':>6} {'chunk':>5}  {'Sarathi (measured)':>18}  " +
          "  ".join(f"{k:>26}" for k in [*models, "H100 profile (composed)"]))
    for prompt, row in SARATHI.items():
        for chunk in CHUNKS:
            vals = [prefill_time(m, prompt, chunk) / prefill_time(m, prompt, 16384)
                    for m in models.values()]
            p = prefill_time(prof, min(prompt, 8191), chunk) / prefill_time(prof, min(prompt, 8191),
                                                                          8192)
            print(f"  {prompt:6d} {chunk:5d}  {row[chunk]:18.3f}  " +
                  "  ".join(f"{v:26.3f}" for v in [*vals, p]))
    print()
    print("2. Interference: step time of 32 decodes at context 1024, alone and with a prefill "
          "chunk (Mistral-7B-v0.2 on A100-80GB-PCIe; the profile: Llama-3.1-8B, H100)")
    mi = load_model("Mistral-7B-v0.2")
    inter = {
        "roofline, constant 0.6/0.8": RooflineModel(mi, hw, step_overhead_s=0.0),
        "roofline, a100 curves": RooflineModel(mi, hw, step_overhead_s=0.0,
                                               curves=load_curves("a100")),
        "H100 profile (composed)": prof,
    }
    decodes = (1024,) * 32
    for label, m in inter.items():
        alone = m.step_time(plan(decode=decodes, sampled=32))
        cells = [f"alone {alone * 1e3:6.2f} ms"]
        for q in (512, 2048):
            mixed = m.step_time(plan([(q, 0)], decodes, sampled=33))
            cells.append(f"+{q} prefill {mixed * 1e3:7.2f} ms ({mixed / alone:4.1f}x)")
        print(f"  {label:28s} " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
