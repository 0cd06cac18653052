"""DistServe's per-GPU goodput, colocated vLLM against disaggregated 2P1D (OSDI'24 §6.2,
chatbot, OPT-13B on A100-80GB). Scenario and its approximations: distserve.yaml.

Paper: "DistServe can sustain 2.0x-4.6x higher request rate compared to vLLM" (chatbot, over
OPT-13B/66B/175B; per-GPU rates at 90 % attainment of TTFT 0.25 s and TPOT 0.1 s for 13B).
Also its Fig. 1 (intro): synthetic 512-token prompts and 64-token outputs on OPT-13B,
colocated "about 1.6 rps", 2P1D "3.3 rps per GPU, which is 2.1x higher" (its SLO values are
only in the figure: the chatbot SLOs stand in, an assumption, so this case stays a rough one).
"""

from __future__ import annotations

import sys

from common import TOLERANCE, max_rate, table, variants, verdict

GPUS = {"colocated": 1, "2P1D": 3}
FIG1 = ["workload.prompt={dist: fixed, value: 512}", "workload.output={dist: fixed, value: 64}"]


def fig1_sensitivity() -> None:
    """``--fig1-sensitivity``: Fig. 1's case under other TTFT / TPOT SLOs (the figure's own are
    not in its text): does any SLO pair give the paper's 2.1x?"""
    rows = []
    for ttft in (250, 400):
        for tpot in (25, 40, 100):
            v = variants("distserve", FIG1 + [f"slo.ttft_ms={ttft}", f"slo.tpot_ms={tpot}"])
            g = {label: max_rate(s) / GPUS[label] for label, s in v.items()}
            rows.append((f"TTFT {ttft} ms, TPOT {tpot} ms", f"{g['colocated']:.2f}",
                         f"{g['2P1D']:.2f}", f"{g['2P1D'] / g['colocated']:.2f}x"))
    print(table(rows, ("SLO (90 % of requests meet both)", "colocated req/s", "2P1D req/s/GPU",
                       "2P1D / colocated")))


def main() -> None:
    v = variants("distserve")
    per_gpu = {label: max_rate(s) / GPUS[label] for label, s in v.items()}
    print("per-GPU goodput (req/s/GPU): " + ", ".join(f"{k} {r:.3g}" for k, r in per_gpu.items()))
    ratio = per_gpu["2P1D"] / per_gpu["colocated"]
    print()
    print(table([("2P1D / colocated per-GPU goodput", "2.0-4.6x", f"{ratio:.2f}x",
                  f"{ratio / 4.6:.2f}-{ratio / 2.0:.2f}")]))
    print()
    fig1 = variants("distserve", FIG1)
    fig1_gpu = {label: max_rate(s) / GPUS[label] for label, s in fig1.items()}
    r1 = fig1_gpu["2P1D"] / fig1_gpu["colocated"]
    print("Fig. 1 case (512 in / 64 out), per-GPU goodput: " +
          ", ".join(f"{k} {r:.3g}" for k, r in fig1_gpu.items()))
    print(table([("Fig. 1: colocated goodput (req/s)", "1.6", f"{fig1_gpu['colocated']:.2f}",
                  f"{fig1_gpu['colocated'] / 1.6:.2f}"),
                 ("Fig. 1: 2P1D per GPU (req/s)", "3.3", f"{fig1_gpu['2P1D']:.2f}",
                  f"{fig1_gpu['2P1D'] / 3.3:.2f}"),
                 ("Fig. 1: 2P1D / colocated", "2.1x", f"{r1:.2f}x", f"{r1 / 2.1:.2f}")]))
    print()
    print("2P1D / colocated: " + verdict(
        ratio, 2.0, 4.6, "with DistServe's own chatbot lengths (fitted to its artifact's "
        "measured vLLM run), its vLLM flags and that vLLM's measured 23.8 ms front-end delay "
        "the ratio moved from 0.54x to 1.73x. Still missing, measured on DistServe's own "
        "requests (benchmarks/RESULTS.md, 2026-11-25): under load the 2023 vLLM's decode "
        "steps slow down more than the roofline's (median TPOT 1.26x simserve's at 1 req/s, "
        "1.82x at 2 req/s, same requests), and DistServe's prefill instance serves a "
        "1,717-token prompt in 145 ms (simserve's 1-GPU prefill replica: 231 ms), which "
        "two 1-GPU prefill replicas, the stand-in for its 2-GPU instance, cannot", TOLERANCE))

if __name__ == "__main__":
    if "--fig1-sensitivity" in sys.argv[1:]:
        fig1_sensitivity()
    else:
        main()
