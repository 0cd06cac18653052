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
engine/pipeline.py); TP 8 across nodes as one replica whose all-reduce ring spans the two
nodes (latency/roofline.py, allreduce_collective): its bytes at the Ethernet's rate
(hardware.scaleout_bandwidth 12.5 GB/s, its slowest hop; an assumption) and, on each of the
ring's 2 (nodes - 1) inter-node steps (NCCL's own latency model), one hop of NCCL over TCP
(hardware.scaleout_latency, 42 us in the A100-80GB-PCIe preset: nccl-tests issue #82).
"""

from __future__ import annotations

from common import strict_and_relaxed, TOLERANCE, max_rate, run, table, verdict, variants

from simserve.engine.build import build_latency
from simserve.sched.plan import StepPlan

TP8 = ["engine.tensor_parallel_size=8", "engine.pipeline_parallel_size=1"]


def orca_cause(cap: float, ratio: float) -> str:
    """What bounds Orca's capacity, measured at it: the artifact's batch_size 8 counts every
    running sequence, both micro-batches' (sarathi-serve orca_scheduler.py: ``len(self.running)
    + 1 > max_num_seqs`` over one running list; base_scheduler.py: up to num_pipeline_stages
    batches in flight), as simserve's orca does, so the setup is the artifact's."""
    s = run(variants("sarathi_pp", [f"workload.rate={cap:.4f}"])["orca"])
    return (f"Orca (the artifact's batch_size 8, all running sequences of both micro-batches) "
            f"is bound by its 8 slots, not by TBT (the same capacity under the 5 s SLO): at "
            f"{cap:.3g} req/s its median scheduling delay is "
            f"{s['median_scheduling_delay_ms'] / 1e3:.2f} s (limit 2 s), P99 TBT "
            f"{s['p99_itl_ms']:.0f} ms (limit 1 s), mean TPOT {s['mean_tpot_ms']:.0f} ms "
            f"(median gap {s['median_itl_ms']:.0f} ms: two stages of a ~4-request micro-batch, "
            f"each reading its stage's weights); slot-bound, its capacity goes as 1 / TPOT, "
            f"so the paper's 5.54x (a third-party reading) needs Orca's tokens "
            f"{1 - 5.54 / ratio:.0%} faster than the roofline prices them; the paper's "
            f"absolute Orca capacity is not in its text to check")


def main() -> None:
    strict, relaxed = strict_and_relaxed("sarathi_pp", 5000)
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
                ratio, 3.6, 4.69, "the range is two readings of its capacity figure, neither "
                "checked against its text; the text itself bounds the PP case's gain at 5.6x "
                "(OSDI abstract, no baseline named), which this ratio is "
                f"{'under' if ratio <= 5.6 else 'OVER'}; see docs/papers.md (Sarathi-Serve's "
                "PP case)", TOLERANCE))
            notes.append("Sarathi / Orca strict: " + verdict(
                orca, 1.0, 5.6, orca_cause(r["orca"], orca), TOLERANCE))
        else:
            rows.append((f"Sarathi / vLLM (TP4-PP2), {name}", "(figure only)", f"{ratio:.2f}x",
                         "-"))
            rows.append((f"Sarathi / Orca (TP4-PP2), {name}", "(figure only)", f"{orca:.2f}x",
                         "-"))

    # today's vLLM (v1, 0.32: chunked prefill, a prompt's next chunk scheduled while its
    # previous one is in flight) at Sarathi's strict budget: not in the paper, whose vLLM is the
    # 2023 one (vllm_v0, whole prompts) on Sarathi-Serve's pipeline engine
    v1 = max_rate(strict["sarathi-512"].replace(policy="vllm_v1", policy_params=None))
    s512 = rates["strict (P99 TBT <= 1 s)"]["sarathi-512"]
    print(f"strict: capacity (req/s) vllm_v1 (0.32, chunked, budget 512) {v1:.3g}")
    rows.append(("Sarathi / vLLM v1 (0.32, budget 512, TP4-PP2), strict", "(not in paper)",
                 f"{s512 / v1:.2f}x", "-"))
    notes.append("Sarathi / vLLM v1 (0.32): today's vLLM chunks prefills under a token budget "
                 "as Sarathi-Serve does, and under PP schedules a prompt's next chunk while its "
                 "previous chunk is in flight (Sarathi-Serve waits for it); the paper's baseline "
                 "is the 2023 vLLM (whole prompts, vllm_v0), so its ratio is the row above")

    # pipeline bubbles (the summary's `pipeline` section) at one load for the three systems:
    # the stage time lost while micro-batches are in flight (too few, or unbalanced ones)
    load = ["workload.rate=0.5", "workload.num_requests=200"]
    bubbles = {k: run(s)["pipeline"]["bubble_fraction"]
               for k, s in variants("sarathi_pp", load).items()
               if k in ("vllm", "sarathi-512", "orca")}
    print("pipeline bubbles at 0.5 req/s (stage time idle while micro-batches are in flight): "
          + ", ".join(f"{k} {b:.0%}" for k, b in bubbles.items()))
    notes.append("pipeline bubbles at 0.5 req/s: " + ", ".join(
        f"{k} {b:.0%}" for k, b in bubbles.items()) + " of stage time while the pipeline has "
        "work (Orca's batch of 8 leaves the stages idle most; docs/metrics.md#pipeline-bubbles)")

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
    ar, total = lat.breakdown(step)["allreduce"] * 1e3, lat.step_time(step) * 1e3
    hop = lat.hw.scaleout_latency
    # the per-collective cost the paper's > 2x needs at this step: the TP8 step's other parts
    # plus 160 all-reduces = 2 x TP4-PP2's median TBT
    need = (2 * pp["median_itl_ms"] - (total - ar)) / 160
    # sensitivity to the hop count: NCCL's model charges 2 (N - 1) = 2 hops; a chunk's
    # data-flow path through an 8-rank ring over 2 nodes crosses a node boundary up to 4 times
    # (2 hops' worth more); a bulk-synchronous ring (every one of the 2 (n - 1) = 14 steps
    # waits for the slowest hop) 14 times. Priced as 2 hops of 2x and of 7x the cited latency.
    sens = []
    for label, k in (("up to 4 crossings (data flow)", 2), ("14 steps (bulk-synchronous)", 7)):
        r = run(variants("sarathi_pp", light + TP8 + [f"hardware.scaleout_latency={k * hop}"])
                ["vllm"])["median_itl_ms"] / pp["median_itl_ms"]
        sens.append(f"{label} {r:.2f}x")
    print(f"TP8 across the nodes: {ar / 160 * 1e3:.0f} us an all-reduce (10-request decode "
          f"step, hop {hop * 1e6:.0f} us); the paper's > 2x needs {need * 1e3:.0f} us; "
          f"median TBT ratio with the network hop on " + ", ".join(sens))
    notes.append("median TBT TP8 / TP4-PP2: " + (
        "AGREES with the paper (> 2x)" if tbt > 2 else
        f"DISAGREES with the paper (> 2x): at TP8 across the nodes the roofline prices each of "
        f"the step's 160 all-reduces (2 a layer) at {ar / 160 * 1e3:.0f} us ({ar:.1f} ms of a "
        f"{total:.1f} ms decode step of 10 requests): NCCL's ring latency model with the "
        f"measured NCCL-over-TCP hop ({hop * 1e6:.0f} us, hardware.scaleout_latency) on its "
        f"2 inter-node steps, bytes at 12.5 GB/s. The paper's > 2x needs about "
        f"{need * 1e3:.0f} us each, which only a ring paying the TCP hop on every one of its "
        f"14 steps reaches (" + "; ".join(sens) + "); not modelled: what else vLLM's "
        "cross-node TP paid in the paper's runs (not in its text)"))
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
