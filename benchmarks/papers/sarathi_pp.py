"""Sarathi-Serve's pipeline-parallel case (OSDI'24): Falcon-180B, TP 4 in a node, PP 2 across
two nodes on 100 Gbps Ethernet. Scenario and its assumptions: sarathi_pp.yaml.

Paper: "When used with pipeline parallelism on Falcon-180B, Sarathi-Serve provides up to 5.6x
gain in the end-to-end serving capacity" (abstract, OSDI'24 version). The per-baseline numbers
of its Falcon-180B capacity figure (openchat_sharegpt4, strict P99 TBT 1 s) as read by a
third-party summary of the paper (not checked against the paper's text here): 4.69x over vLLM,
5.54x over Orca; an earlier reading recorded in docs/papers.md: 3.6x over vLLM. Hence the range
3.6-4.7x for Sarathi / vLLM and "up to 5.6x" for Sarathi / Orca. Its hybrid-parallelism figure:
TP 8 across the two nodes gives a median TBT more than 2x that of TP 4 - PP 2 (all-reduces over
Ethernet), and lower capacity.

simserve: the same scenario under pipeline parallelism (engine.pipeline_parallel_size,
engine/pipeline.py); TP 8 across nodes as one replica whose all-reduce ring runs at the
Ethernet's rate (hardware.interconnect_bandwidth 12.5 GB/s: its slowest hop; an assumption).
"""

from __future__ import annotations

import dataclasses

from common import TOLERANCE, max_rate, run, table, verdict, variants

from simserve.engine.build import build_latency
from simserve.sched.plan import StepPlan

TP8 = ["engine.tensor_parallel_size=8", "engine.pipeline_parallel_size=1",
       "hardware.interconnect_bandwidth=12.5e9"]


def main() -> None:
    strict = variants("sarathi_pp")
    relaxed = variants("sarathi_pp", ["slo.tbt_ms=5000"])
    s512 = relaxed.pop("sarathi-512")
    relaxed["sarathi-2048"] = s512.replace(
        engine=dataclasses.replace(s512.engine, max_num_batched_tokens=2048))
    rows, notes = [], []
    rates = {}
    for name, v, budget in (("strict (P99 TBT <= 1 s)", strict, "sarathi-512"),
                            ("relaxed (P99 TBT <= 5 s)", relaxed, "sarathi-2048")):
        r = rates[name] = {label: max_rate(s) for label, s in v.items()}
        print(f"{name}: capacity (req/s) " + ", ".join(f"{k} {x:.3g}" for k, x in r.items()))
        ratio, orca = r[budget] / r["vllm"], r[budget] / r["orca"]
        if name.startswith("strict"):
            rows.append((f"Sarathi / vLLM (TP4-PP2), {name}", "3.6-4.7x", f"{ratio:.2f}x",
                         f"{ratio / 4.69:.2f}-{ratio / 3.6:.2f}"))
            rows.append((f"Sarathi / Orca (TP4-PP2), {name}", "up to 5.6x", f"{orca:.2f}x",
                         f"{orca / 5.6:.2f}"))
            notes.append("Sarathi / vLLM strict: " + verdict(
                ratio, 3.6, 4.69, "see docs/papers.md (Sarathi-Serve's PP case)", TOLERANCE))
            notes.append("Sarathi / Orca strict: " + verdict(
                orca, 1.0, 5.6, "Orca (batch 8) is throughput-bound, not TBT-bound: its "
                "capacity is the same under both SLOs here, so the ratio rests on what the "
                "roofline charges Falcon-180B micro-batches of ~4 requests (weight reads); "
                "the paper's absolute Orca capacity is not in its text to check", TOLERANCE))
        else:
            rows.append((f"Sarathi / vLLM (TP4-PP2), {name}", "(figure only)", f"{ratio:.2f}x",
                         "-"))
            rows.append((f"Sarathi / Orca (TP4-PP2), {name}", "(figure only)", f"{orca:.2f}x",
                         "-"))

    # hybrid parallelism: TP 8 across the nodes against TP 4 - PP 2, vLLM, at a light load
    light = ["workload.rate=0.2", "workload.num_requests=200"]
    pp = run(variants("sarathi_pp", light)["vllm"])
    tp8 = run(variants("sarathi_pp", light + TP8)["vllm"])
    tbt = tp8["median_itl_ms"] / pp["median_itl_ms"]
    print(f"vLLM at 0.2 req/s: median TBT TP8 (cross-node) {tp8['median_itl_ms']:.0f} ms, "
          f"TP4-PP2 {pp['median_itl_ms']:.0f} ms")
    rows.append(("median TBT, vLLM TP8 (cross-node) / TP4-PP2, 0.2 req/s", "> 2x",
                 f"{tbt:.2f}x", "-"))
    # what a cross-node all-reduce costs here: a decode step of 10 requests at context 2,500
    lat = build_latency(variants("sarathi_pp", TP8)["vllm"])
    step = StepPlan(request_ids=tuple(range(10)), num_new_tokens=(1,) * 10, prefill_lens=(),
                    prefill_ctx=(), decode_ctx=(2500,) * 10, num_sampled=10)
    parts = lat.breakdown(step)
    ar, total = parts["allreduce"] * 1e3, lat.step_time(step) * 1e3
    notes.append("median TBT TP8 / TP4-PP2: " + (
        "AGREES with the paper (> 2x)" if tbt > 2 else
        f"DISAGREES with the paper (> 2x): at TP8 across the nodes the roofline prices the "
        f"step's 160 all-reduces (2 a layer) at {ar:.1f} ms of a {total:.1f} ms decode step "
        f"(10 requests), {ar / 160 * 1e3:.0f} us each; for the paper's > 2x they would cost "
        f"about 0.7 ms each (NCCL over TCP on 100 Gbps Ethernet: its per-collective latency "
        f"is not modelled, only the link's rate and the NVLink-class fixed latency)"))
    tp8_cap = max_rate(variants("sarathi_pp", TP8)["vllm"])
    s_over_tp8 = rates["strict (P99 TBT <= 1 s)"]["sarathi-512"] / tp8_cap
    print(f"strict: capacity (req/s) vllm TP8 (cross-node) {tp8_cap:.3g}")
    rows.append(("Sarathi TP4-PP2 / vLLM TP8 (cross-node), strict", "(figure only)",
                 f"{s_over_tp8:.2f}x", "-"))
    print()
    print(table(rows))
    print()
    print("\n".join(notes))


if __name__ == "__main__":
    main()
