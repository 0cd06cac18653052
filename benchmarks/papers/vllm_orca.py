"""The vLLM paper's headline against Orca (SOSP'23 §6.2, Fig. 12a and Fig. 13): OPT-13B, one
A100-40GB, ShareGPT-like lengths. Scenario and its assumptions: vllm_orca.yaml.

Paper [§6.2]: "vLLM can sustain 1.7x-2.7x higher request rates compared to Orca (Oracle) and
2.7x-8x compared to Orca (Max)" (ranges over the three OPT sizes; 13B is one point in them).
Fig. 13 (ShareGPT at 2 req/s): average batched requests Max 7.00, Pow2 9.81, Oracle 13.62,
vLLM 30.42.
"""

from __future__ import annotations

import dataclasses

from common import TOLERANCE, max_rate, run, table, variants, verdict

PAPER_BATCH = {"orca-max": 7.00, "orca-pow2": 9.81, "orca-oracle": 13.62, "vllm": 30.42}
RANGES = {"orca-oracle": (1.7, 2.7), "orca-max": (2.7, 8.0)}


def main() -> None:
    v = variants("vllm_orca")
    rates = {label: max_rate(s) for label, s in v.items()}
    rows, notes = [], []
    for label in ("orca-oracle", "orca-pow2", "orca-max"):
        ratio = rates["vllm"] / rates[label]
        lo, hi = RANGES.get(label, (None, None))
        paper = f"{lo:g}-{hi:g}x" if lo else "(no number)"
        rows.append((f"vLLM / {label} capacity", paper, f"{ratio:.2f}x",
                     f"{ratio / hi:.2f}-{ratio / lo:.2f}" if lo else "-"))
        if lo:
            notes.append(f"vLLM / {label}: " + verdict(
                ratio, lo, hi, "here the systems share one latency model, so only their memory "
                "policies differ (the paper's Orca ran on FasterTransformer kernels)",
                TOLERANCE))
    print("capacity (max rate with mean normalized latency <= 0.4 s/token, req/s): " +
          ", ".join(f"{k} {r:.3g}" for k, r in rates.items()))
    print()
    for label, s in v.items():          # Fig. 13: mean batched requests at 2 req/s
        w = dataclasses.replace(s.workload, arrival=dataclasses.replace(s.workload.arrival,
                                                                         rate=2.0))
        got = run(s.replace(workload=w))["mean_running"]
        rows.append((f"{label} mean batch at 2 req/s (Fig. 13)", f"{PAPER_BATCH[label]:.2f}",
                     f"{got:.2f}", f"{got / PAPER_BATCH[label]:.2f}"))
    print(table(rows))
    print()
    print("\n".join(notes))


if __name__ == "__main__":
    main()
