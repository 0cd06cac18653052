"""Simulator speed on the Vidur-equivalent workload (the speed issue's targets).

Workload: Llama-2-7B on an A100-80GB (roofline step latency), Poisson arrivals at 3 req/s,
(prompt, output) pairs drawn from the Azure LLM inference trace 2023 (conv), vLLM v0 and
v1/Sarathi policies: the setting in which Vidur took 40-56 s for 10,000 requests here.

Each size runs in a fresh subprocess so its peak RSS is its own. Prints one table row per
(policy, size): wall and CPU seconds of `simserve.run` (workload, simulation, metrics), engine
iterations simulated per second, peak RSS, and, where --stepwise covers the size, the same run
stepped one iteration per event and the stepwise/fast-forward ratio measured back to back
(the honest figure on a shared machine). Also cold start: import + scenario load + profile
load, wall time and RSS.

    python benchmarks/sim_speed.py                 # 10k and 50k, stepwise ratio at 10k
    python benchmarks/sim_speed.py --sizes 10000 50000 1000000 --stepwise 10000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AZURE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"

SCENARIO = {
    "name": "vidur-equivalent", "seed": 0,
    "model": "Llama-2-7B", "hardware": "A100-80GB",
    "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 4096, "block_size": 16,
               "max_model_len": 4096},
    "scheduler": {"policy": "vllm_v0"},
    "latency": {"model": "roofline"},
    "workload": {"arrival": "poisson", "rate": 3, "num_requests": 10000,
                 "lengths": {"path": str(AZURE), "prompt_column": "ContextTokens",
                             "output_column": "GeneratedTokens"}},
}

CHILD = textwrap.dedent("""
    import json, resource, sys, time
    t0 = time.perf_counter()
    import simserve
    from simserve.config import parse_scenario
    raw, fast_forward = json.loads(sys.argv[1]), sys.argv[2] == "1"
    s = parse_scenario(raw)
    c0, w0 = time.process_time(), time.perf_counter()
    r = simserve.run(s, fast_forward=fast_forward)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"wall": wall, "cpu": cpu, "steps": r.num_steps, "rss": rss,
                      "completed": r.summary["completed"],
                      "mean_ttft_ms": r.summary["mean_ttft_ms"]}))
""")

COLD = textwrap.dedent("""
    import resource, sys, time
    t0 = time.perf_counter()
    import simserve
    from simserve.config import load_scenario
    from simserve.engine.build import build_latency
    s = load_scenario(sys.argv[1])
    build_latency(s)
    print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
""")


def child(raw: dict, fast_forward: bool) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(raw),
                           "1" if fast_forward else "0"],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        sys.exit(f"benchmark run failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 50000])
    ap.add_argument("--policies", nargs="+", default=["vllm_v0", "vllm_v1", "sarathi"])
    ap.add_argument("--stepwise", type=int, nargs="*", default=[10000],
                    help="sizes also run stepwise for the ratio")
    args = ap.parse_args()
    if not AZURE.exists():
        sys.exit(f"needs the Azure conv trace at {AZURE} (see ../shared/traces/README.md)")
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load:.2f} at start "
          f"(timings inflate when the machine is busy)")
    print(f"{'policy':9s} {'requests':>9s} {'wall s':>8s} {'cpu s':>7s} {'iters':>9s} "
          f"{'iters/s':>9s} {'RSS MB':>7s} {'stepwise s':>10s} {'ratio':>6s}")
    for policy in args.policies:
        for n in args.sizes:
            raw = json.loads(json.dumps(SCENARIO))
            raw["scheduler"]["policy"] = policy
            raw["workload"]["num_requests"] = n
            fast = child(raw, True)
            step_s = ratio = ""
            if n in args.stepwise:
                slow = child(raw, False)
                if slow["steps"] != fast["steps"] or slow["mean_ttft_ms"] != fast["mean_ttft_ms"]:
                    sys.exit(f"fast-forward and stepwise disagree for {policy} at {n}")
                step_s, ratio = f"{slow['wall']:.2f}", f"{slow['wall'] / fast['wall']:.1f}x"
            print(f"{policy:9s} {n:9d} {fast['wall']:8.2f} {fast['cpu']:7.2f} "
                  f"{fast['steps']:9d} {fast['steps'] / fast['wall']:9.0f} "
                  f"{fast['rss'] / 2**20:7.0f} {step_s:>10s} {ratio:>6s}")
    scen = ROOT / "scenarios" / "quickstart.yaml"
    proc = subprocess.run([sys.executable, "-c", COLD, str(scen)], capture_output=True,
                          text=True, cwd=ROOT)
    wall, rss = proc.stdout.split()
    print(f"cold start (import + scenario + latency model): {float(wall):.2f} s, "
          f"RSS {int(rss) / 2**20:.0f} MB")


if __name__ == "__main__":
    main()
