"""FastServe's gain over vLLM in latency per output token (arXiv 2305.05920; NSDI'26 artifact,
single GPU). Scenario and its assumptions: fastserve.yaml.

Paper (secondary sources only; the body is not available as primary text, digest §5): vs
vLLM on ShareGPT "2.1-6.1x" (NSDI'26 summary) or "2.3-18.3x" (v3 notes) in the rate sustained
at the same per-token latency; swapping "< 5 %" of latency.
"""

from __future__ import annotations

from common import TOLERANCE, max_rate, run, table, variants, verdict


def main() -> None:
    v = variants("fastserve")
    rates = {label: max_rate(s) for label, s in v.items()}
    print("capacity at 0.3 s/token (req/s): " + ", ".join(f"{k} {r:.3g}" for k, r in rates.items()))
    ratio = rates["fastserve"] / rates["vllm"]
    at = {label: run(s) for label, s in v.items()}
    for label, s in at.items():
        print(f"  at {v[label].workload.arrival.rate:g} req/s: {label} mean normalized latency "
              f"{s['mean_normalized_latency_ms']:.0f} ms/token, preemptions "
              f"{s['total_preemptions']}")
    print()
    print(table([("FastServe / vLLM capacity", "2.1-6.1x (NSDI'26)", f"{ratio:.2f}x",
                  f"{ratio / 6.1:.2f}-{ratio / 2.1:.2f}")]))
    print()
    print("FastServe / vLLM: " + verdict(
        ratio, 2.1, 6.1, "simserve's fastserve counts its quanta and starvation in iterations; "
        "FastServe uses time quanta (10 ms, x2) from a prefill-time model", TOLERANCE))


if __name__ == "__main__":
    main()
