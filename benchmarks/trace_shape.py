"""Derive the real-trace-shaped workload the GPU campaign ships (``benchmarks/data/
azure_conv_shape.csv``) from the Azure 2023 conversation trace in ``../shared/traces``.

The campaign must not need ``../shared`` at run time (it does not travel to the device), so
it ships its own small file: ``n`` requests whose inter-arrival gaps are drawn (with
replacement, seeded) from the trace's own gaps, so its burstiness is kept, and whose (prompt,
output) length pairs are drawn jointly from the trace's rows, so their correlation is kept.
Columns: ``arrival_s, prompt_tokens, output_tokens`` (simserve's plain csv trace format); the
campaign rescales the rate to a fraction of the measured capacity.

    python benchmarks/trace_shape.py ../shared/traces/AzureLLMInferenceTrace_conv.csv \\
        benchmarks/data/azure_conv_shape.csv --n 300 --seed 0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def derive(src: Path, n: int, seed: int) -> pd.DataFrame:
    df = pd.read_csv(src)
    t = pd.to_datetime(df["TIMESTAMP"]).sort_values()
    gaps = t.diff().dt.total_seconds().dropna().to_numpy()
    rng = np.random.default_rng(seed)
    arrival = np.r_[0.0, np.cumsum(rng.choice(gaps, size=n - 1, replace=True))]
    rows = rng.integers(0, len(df), size=n)
    return pd.DataFrame({"arrival_s": arrival.round(6),
                         "prompt_tokens": df["ContextTokens"].to_numpy()[rows].astype(int),
                         "output_tokens": df["GeneratedTokens"].to_numpy()[rows].astype(int)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.src.exists():
        print(f"error: {args.src}: not found", file=sys.stderr)
        return 2
    if args.n < 2:
        print(f"error: --n: must be >= 2, got {args.n}", file=sys.stderr)
        return 2
    df = derive(args.src, args.n, args.seed)
    df.to_csv(args.out, index=False)
    print(f"{args.out}: {len(df)} requests over {df['arrival_s'].iloc[-1]:.1f} s; prompt p50 "
          f"{df['prompt_tokens'].median():.0f}, output p50 {df['output_tokens'].median():.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
