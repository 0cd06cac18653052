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

    python benchmarks/fidelity_gaps.py runs/fidelity/real/light/run2 \
        runs/fidelity/sim_calibrated/light
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from simserve.live.calibrate import load_steps  # noqa: E402


def _read(path: Path, name: str) -> pd.DataFrame:
    f = path / name
    if not f.exists():
        sys.exit(f"error: {f} not found (a replay directory has requests.csv, tokens.csv "
                 f"and chunks.csv; a simulated one steps.csv)")
    return pd.read_csv(f)


def steps_of(real: Path):
    """The replay's pure decode and mixed steps (``simserve.live.calibrate.load_steps``, which
    calibration's load probe uses too), from its chunks and prompt lengths."""
    req, chunks = _read(real, "requests.csv"), _read(real, "chunks.csv")
    prompts = dict(zip(req["request_id"], req["num_prompt_tokens"]))
    return load_steps([{"prompt": int(prompts[rid]), "times": g["time_s"].tolist(),
                        "counts": g["num_tokens"].tolist()}
                       for rid, g in chunks.groupby("request_id")])


def decode_gaps(real: Path) -> pd.DataFrame:
    """(streams alive, seconds per step) of every pure decode gap of a replay."""
    return pd.DataFrame([(len(c), s) for s, c in steps_of(real).decode],
                        columns=["streams", "gap_s"])


def mixed_stalls(real: Path) -> pd.DataFrame:
    """(prompt tokens, seconds) of the mixed step that ends each newcomer's prompt."""
    return pd.DataFrame([(p, s) for p, s, _ in steps_of(real).mixed],
                        columns=["prompt", "step_s"])


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
