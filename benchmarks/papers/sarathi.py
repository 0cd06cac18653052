"""Sarathi-Serve's capacity gain under strict and relaxed P99-TBT SLOs (OSDI'24 §5.1-5.2),
Mistral-7B-v0.2 on one A100 80GB PCIe. Scenario and its approximations: sarathi.yaml.

Paper: "2.6x higher serving capacity" for Mistral-7B on one A100 (abstract); "3.5x higher
capacity compared to vLLM under strict SLO (100ms, Mistral-7B) using a small token budget of
512" (§5.2). Relaxed SLO: 1.65x over vLLM is reported for Yi-34B (§5.2), not for Mistral-7B.
Pipeline parallelism (the paper's Falcon-180B TP4-PP2 case: 3.6x over vLLM hybrid, strict) is
not reproduced: simserve has no pipeline-parallel engine yet.
"""

from __future__ import annotations

from common import strict_and_relaxed, TOLERANCE, max_rate, table, verdict


def main() -> None:
    strict, relaxed = strict_and_relaxed("sarathi", 500)
    rows, notes = [], []
    for name, v, budget in (("strict (P99 TBT <= 100 ms)", strict, "sarathi-512"),
                            ("relaxed (P99 TBT <= 500 ms)", relaxed, "sarathi-2048")):
        rates = {label: max_rate(s) for label, s in v.items()}
        print(f"{name}: capacity (req/s) " + ", ".join(f"{k} {r:.3g}" for k, r in rates.items()))
        ratio = rates[budget] / rates["vllm"]
        orca = rates[budget] / rates["orca"]
        if name.startswith("strict"):
            rows.append((f"Sarathi / vLLM, {name}", "2.6x (abstract), 3.5x (5.2)",
                         f"{ratio:.2f}x", f"{ratio / 3.5:.2f}-{ratio / 2.6:.2f}"))
            notes.append("Sarathi / vLLM strict: " + verdict(
                ratio, 2.6, 3.5, "vLLM's whole-prompt prefills stall its decodes past the TBT "
                "limit at a lower rate in the paper than here; the lengths are a lognormal "
                "fit, not the trace", TOLERANCE))
        else:
            rows.append((f"Sarathi / vLLM, {name}", "(Mistral: none; Yi-34B 1.65x)",
                         f"{ratio:.2f}x", "-"))
        rows.append((f"Sarathi / Orca (batch 16), {name}", "(figure only)", f"{orca:.2f}x", "-"))
    print()
    print(table(rows))
    print()
    print("\n".join(notes))
    print("PP case (Falcon-180B TP4-PP2): benchmarks/papers/sarathi_pp.py.")


if __name__ == "__main__":
    main()
