"""``vllm_native`` (vLLM's own scheduler in the loop) against the re-implemented ``vllm_v1``:
wall time of the same scenario, and whether their summaries agree.

Runs ``vllm_v1`` with fast-forward (the default), ``vllm_v1`` one step per event, and
``vllm_native`` (always one step per event), ``--repeats`` times each in this process (the
first ``vllm_native`` run also pays vLLM's imports, reported apart), and prints medians.

    python benchmarks/vllm_native_speed.py scenarios/quickstart.yaml --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import simserve  # noqa: E402
from simserve.config import load_scenario  # noqa: E402

KEYS = ("completed", "duration_s", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
        "total_preemptions", "num_steps")


def timed(s, fast_forward: bool):
    t0 = time.perf_counter()
    r = simserve.run(s, fast_forward=fast_forward)
    return time.perf_counter() - t0, r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="?", default=str(ROOT / "scenarios" / "quickstart.yaml"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from simserve.sched.vllm_native import vllm_version
    version = vllm_version()
    if version is None:
        print("error: vLLM is not installed here (make oracle builds an environment with it)",
              file=sys.stderr)
        return 2
    base = load_scenario(args.scenario)
    native = load_scenario(args.scenario, ["scheduler.policy=vllm_native"])
    t0 = time.perf_counter()
    import vllm.v1.core.sched.scheduler  # noqa: F401  (the imports, timed apart)
    imports = time.perf_counter() - t0
    runs = {"vllm_v1 fast-forward": (base, True), "vllm_v1 stepwise": (base, False),
            "vllm_native": (native, False)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    results = {}
    for _ in range(args.repeats):
        for label, (s, ff) in runs.items():
            t, r = timed(s, ff)
            times[label].append(t)
            results[label] = r
    print(f"{base.name}: {results['vllm_v1 stepwise'].summary['completed']} requests; "
          f"vLLM {version} (its imports: {imports:.1f} s, once per process); "
          f"median of {args.repeats}")
    ref = statistics.median(times["vllm_v1 stepwise"])
    for label, ts in times.items():
        m = statistics.median(ts)
        print(f"  {label:22s} {m:8.2f} s   {m / ref:5.1f}x vllm_v1 stepwise")
    print(f"  {'metric':22s} {'vllm_v1':>14s} {'vllm_native':>14s}")
    same = True
    for k in KEYS:
        a, b = results["vllm_v1 fast-forward"].summary[k], results["vllm_native"].summary[k]
        same &= a == b
        print(f"  {k:22s} {a:14.6g} {b:14.6g}{'' if a == b else '   DIFFERENT'}")
    print("summaries identical" if same else "summaries DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
