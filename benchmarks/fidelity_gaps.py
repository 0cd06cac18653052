"""Where a simulated run and a real one part: step by step, from the client's token stream.

A real replay (``simserve replay --out REAL``) records every token's arrival; a simulation of
the same scenario (``simserve run --out SIM``) records every engine step. Two kinds of steps
can be told apart on the client's side:

* **pure decode steps**: a gap between two tokens of one stream with no other request's first
  token inside it (nor within 2 ms after): one engine step in which every running request
  decoded. Binned by the number of streams alive across the gap, against the simulated
  decode-only steps binned by ``num_decode_seqs``.
* **mixed steps**: the step that completes a newcomer's prompt while others decode. Its
  length shows as the longest gap, among the streams running across it, that ends within
  ±5 ms of the newcomer's first token. Binned by prompt length, against the simulated steps
  with both prefill tokens and decodes, binned by ``num_prefill_tokens``.

Chunk merging (the server's HTTP side falling behind) is undone for decode gaps: a chunk of n
tokens ends a gap of n steps (``chunks.csv``), and chunks read less than 1 ms apart count as
one. Medians throughout; decode bins with fewer than
``--min-count`` real gaps are left out.

    python benchmarks/fidelity_gaps.py runs/fidelity/real/light/run2 runs/fidelity/sim_calibrated/light
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def _read(path: Path, name: str) -> pd.DataFrame:
    f = path / name
    if not f.exists():
        sys.exit(f"error: {f} not found (a replay directory has requests.csv, tokens.csv "
                 f"and chunks.csv; a simulated one steps.csv)")
    return pd.read_csv(f)


def decode_gaps(real: Path) -> pd.DataFrame:
    """(streams alive, seconds per step) of every pure decode gap of a replay. A chunk of n
    tokens (the HTTP side merged n steps' outputs) ends a gap of n steps."""
    req, chunks = _read(real, "requests.csv"), _read(real, "chunks.csv")
    firsts = np.sort(req["first_token_s"].dropna().to_numpy())
    alive_from, alive_to = req["first_token_s"].to_numpy(), req["finish_s"].to_numpy()
    rows = []
    for _, g in chunks.groupby("request_id"):
        ts, n = _deliveries(g["time_s"].to_numpy(), g["num_tokens"].to_numpy())
        for a, b, k in zip(ts[:-1], ts[1:], n[1:]):
            j = np.searchsorted(firsts, a + 1e-6)
            if k < 1 or j < len(firsts) and firsts[j] <= b + 0.002:
                continue                          # a newcomer's prefill ran in this gap
            rows.append((int(((alive_from <= a) & (alive_to >= b)).sum()), (b - a) / k))
    return pd.DataFrame(rows, columns=["streams", "gap_s"])


def _deliveries(ts: np.ndarray, n: np.ndarray, within: float = 0.001):
    """Chunks less than ``within`` apart as one delivery (SSE events read together), with
    their tokens summed: no engine step here is that short."""
    times, tokens = [ts[0]], [int(n[0])]
    for t, k in zip(ts[1:], n[1:]):
        if t - times[-1] < within:
            tokens[-1] += int(k)
            times[-1] = t
        else:
            times.append(t)
            tokens.append(int(k))
    return np.array(times), np.array(tokens)


def mixed_stalls(real: Path) -> pd.DataFrame:
    """(prompt tokens, seconds) of the mixed step that ends each newcomer's prompt."""
    req, tok = _read(real, "requests.csv"), _read(real, "tokens.csv")
    streams = {r: g["time_s"].to_numpy() for r, g in tok.groupby("request_id")}
    rows = []
    for q in req.itertuples():
        t1 = q.first_token_s
        if not np.isfinite(t1):
            continue
        longest = []
        for r, ts in streams.items():
            if r == q.request_id or len(ts) < 3 or ts[0] > q.arrival_s or ts[-1] < t1 + 0.01:
                continue                          # not streaming across the newcomer's prefill
            ends, gaps = ts[1:], np.diff(ts)
            near = (ends >= t1 - 0.005) & (ends <= t1 + 0.005)
            if near.any():
                longest.append(gaps[near].max())
        if longest:
            rows.append((q.num_prompt_tokens, float(np.median(longest))))
    return pd.DataFrame(rows, columns=["prompt", "step_s"])


def tables(real: Path, sim: Path, min_count: int = 20) -> tuple[pd.DataFrame, pd.DataFrame]:
    steps = _read(sim, "steps.csv")
    gaps = decode_gaps(real)
    dec = steps[steps["num_prefill_tokens"] == 0]
    by = gaps.groupby("streams")["gap_s"]
    decode = pd.DataFrame({"real ms": by.median() * 1e3, "real gaps": by.size(),
                           "sim ms": dec.groupby("num_decode_seqs")["duration_s"].median() * 1e3})
    decode = decode[decode["real gaps"] >= min_count].dropna()
    decode["error %"] = (decode["sim ms"] / decode["real ms"] - 1) * 100
    decode.index.name = "streams"

    stalls = mixed_stalls(real)
    mixed_sim = steps[(steps["num_prefill_tokens"] > 0) & (steps["num_decode_seqs"] > 0)]
    top = int(max(stalls["prompt"].max() if len(stalls) else 0,
                  mixed_sim["num_prefill_tokens"].max() if len(mixed_sim) else 0))
    edges = [0, 128, 256, 384, 512] + ([top] if top > 512 else [])
    rb = stalls.groupby(pd.cut(stalls["prompt"], edges), observed=True)["step_s"]
    sb = mixed_sim.groupby(pd.cut(mixed_sim["num_prefill_tokens"], edges),
                           observed=True)["duration_s"]
    mixed = pd.DataFrame({"real ms": rb.median() * 1e3, "real steps": rb.size(),
                          "sim ms": sb.median() * 1e3, "sim steps": sb.size()}).dropna()
    mixed["error %"] = (mixed["sim ms"] / mixed["real ms"] - 1) * 100
    mixed.index = [f"{iv.left + 1}-{iv.right}" for iv in mixed.index]
    mixed.index.name = "prompt tokens"
    return decode, mixed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("real", type=Path, help="a replay directory (simserve replay --out)")
    ap.add_argument("sim", type=Path, help="a simulation of the same scenario (simserve run --out)")
    ap.add_argument("--min-count", type=int, default=20,
                    help="leave out decode bins with fewer real gaps than this")
    args = ap.parse_args()
    decode, mixed = tables(args.real, args.sim, args.min_count)
    print("pure decode steps (median), by streams alive:")
    print(decode.round(2).to_string())
    print("\nmixed steps (median; real: the longest gap of the others around the newcomer's "
          "first token), by prompt length:")
    print(mixed.round(2).to_string())


if __name__ == "__main__":
    main()
