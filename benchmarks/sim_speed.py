"""Simulator speed: the whole process as a user runs it, and the simulation inside it.

Two workloads, both Llama-2-7B on an A100-80GB with roofline step latency, Poisson arrivals at
3 req/s, max_num_seqs 128, max_num_batched_tokens 4096, block 16 (and a third, below):

* ``bench`` (default; issue #21's): prompt and output lengths normal (mean 512, sd 256, min 2,
  max 7000), vLLM v1's policy: the setting in which the fastest peer, BLIS (Go), took 12.0 s
  for 10,000 requests (its own defaults, roofline, ``--timeout -1``) and ~126 CPU-s and 4.5 GB
  for 100,000 on our development VM;
* ``vidur``: (prompt, output) pairs resampled from the Azure LLM inference trace 2023 (conv),
  vLLM v0, v1 and Sarathi: the setting in which Vidur took 40-56 s for 10,000 requests.
* ``shared_prefix`` (issue #31's): multi-user chat with prefix caching on and off, the
  ``shared_prefix`` workload (inference-perf's, as in the measured H100 runs of
  docs/fidelity.md): 9 groups x 5 users, each user's prompt (its group's 100-token
  system prompt + its own 447-token question) recurring every 45 requests, 248 output tokens,
  Poisson at 6 req/s; Llama-3.1-8B on an H100-SXM, roofline, vLLM v1, max_num_seqs 128,
  max_num_batched_tokens 2048, block 16. Each size runs twice, ``cache on`` and ``cache off``;
  the targets (issue #31): cache on within 1.5x of cache off (the median of the rounds'
  ratios: each round runs both, back to back), and 10,000 requests <= 1 s, whole process.

simserve's modules are compiled to bytecode first (``compile_bytecode``), so that no timed
process compiles them from source: a user's installed copy has its bytecode.

For each (policy, size), ``--repeat`` rounds (a workload's variants in turn within a round),
medians printed:

* **whole process**: ``python -m simserve run <scenario> --no-report --quiet --out <tmp>`` in a
  fresh process, wall and CPU seconds (``os.wait4``'s rusage) and its peak RSS; the sizes of the
  files it wrote;
* **phases**, in another fresh process doing what ``simserve run`` does: start-up (interpreter
  to the scenario loaded: imports, YAML, model card), ``simserve.run`` (workload, simulation,
  metrics), of which the metrics (``runner.collect``: the request columns and the summary,
  NumPy only), ``Result.save`` (writing the outputs: CSV from the columns, no pandas).

On the bench workload each size's row is followed by issue #21's targets for it (whole process
wall time at 10k, 100k and 1M requests, the simulation at 10k, peak RSS at 1M and 10M, start-up),
each marked met or not. The load average is printed at the start and the end: timings
inflate when the machine is busy (compare ratios within one run; benchmarks/sim_instructions.py
counts instructions instead).

    python benchmarks/sim_speed.py                         # bench workload, 10k and 100k
    python benchmarks/sim_speed.py --sizes 10000 --repeat 5
    python benchmarks/sim_speed.py --workload vidur --sizes 10000 50000 --stepwise 10000
    python benchmarks/sim_speed.py --workload shared_prefix --repeat 2 --stepwise 10000
    python benchmarks/sim_speed.py --async --sizes 10000 --stepwise 10000   # async scheduling
    python benchmarks/sim_speed.py --replicas 4 --router least_outstanding --sizes 10000

``--replicas N`` runs a cluster of N replicas behind ``--router`` (round_robin by default) at
N times the workload's rate, so that each replica carries what the one replica did; the
issues' targets (set for one replica) are not printed then.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

from simserve.cluster.routing import ROUTERS

ROOT = Path(__file__).resolve().parent.parent
AZURE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"

_BASE = {
    "seed": 0, "model": "Llama-2-7B", "hardware": "A100-80GB",
    "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 4096, "block_size": 16},
    "latency": {"model": "roofline"},
}
_NORMAL = {"dist": "normal", "mean": 512, "std": 256, "min": 2, "max": 7000}
WORKLOADS = {
    "bench": {**_BASE, "name": "bench-normal-512", "scheduler": {"policy": "vllm_v1"},
              "workload": {"arrival": "poisson", "rate": 3, "num_requests": 10000,
                           "prompt": dict(_NORMAL), "output": dict(_NORMAL)}},
    "vidur": {**_BASE, "name": "vidur-equivalent", "scheduler": {"policy": "vllm_v0"},
              "engine": {**_BASE["engine"], "max_model_len": 4096},
              "workload": {"arrival": "poisson", "rate": 3, "num_requests": 10000,
                           "lengths": {"path": str(AZURE), "prompt_column": "ContextTokens",
                                       "output_column": "GeneratedTokens"}}},
}
WORKLOADS["shared_prefix"] = {
    "seed": 0, "name": "shared-prefix-chat", "model": "Llama-3.1-8B", "hardware": "H100-SXM",
    "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "block_size": 16},
    "latency": {"model": "roofline"}, "scheduler": {"policy": "vllm_v1"},
    "workload": {"arrival": "poisson", "rate": 6, "num_requests": 10000, "shared_prefix": {
        "num_unique_system_prompts": 9, "num_users_per_system_prompt": 5,
        "system_prompt_len": 100, "question_len": 447, "output_len": 248}}}
DEFAULT_POLICIES = {"bench": ["vllm_v1"], "vidur": ["vllm_v0", "vllm_v1", "sarathi"],
                    "shared_prefix": ["vllm_v1"]}
# each size is run once per variant: (label, engine fields)
VARIANTS = {"shared_prefix": [("cache on", {"enable_prefix_caching": True}),
                              ("cache off", {"enable_prefix_caching": False})]}
PREFIX_TARGETS = (1.5, 1.0)   # issue #31: on/off whole-process ratio; 10k whole process s
# issue #21's targets on the bench workload, by size: (what, the median's key, at most)
TARGETS = {
    10_000: [("whole process wall s", "wall", 1.2), ("simulation (simserve.run) wall s",
                                                     "simulate", 0.6)],
    100_000: [("whole process wall s", "wall", 12.0)],
    1_000_000: [("whole process wall s", "wall", 30.0), ("peak RSS MB", "rss_mb", 500.0)],
    10_000_000: [("peak RSS MB (finishes on a 24 GB machine)", "rss_mb", 24 * 1024.0)],
}
STARTUP_TARGET = 0.3    # `simserve run` start-up, wall seconds
DEFAULT_SIZES = {"bench": [10000, 100000], "vidur": [10000, 50000],
                 "shared_prefix": [10000, 100000]}

PHASES = textwrap.dedent("""
    import json, os, resource, sys, time
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # (as `simserve run` sets it)
    t0, c0 = time.perf_counter(), time.process_time()
    import simserve.cli, simserve.runner
    from simserve.config import load_scenario
    path, out, fast_forward = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    s = load_scenario(path)
    t1, c1 = time.perf_counter(), time.process_time()
    spent = [0.0, 0.0]                  # the metrics (runner.collect), timed inside the run
    collect = simserve.runner.collect
    def timed_collect(*a, **k):
        m0, n0 = time.perf_counter(), time.process_time()
        try:
            return collect(*a, **k)
        finally:
            spent[0] += time.perf_counter() - m0
            spent[1] += time.process_time() - n0
    simserve.runner.collect = timed_collect
    r = simserve.runner.run(s, fast_forward=fast_forward)
    t2, c2 = time.perf_counter(), time.process_time()
    r.save(out)
    t3, c3 = time.perf_counter(), time.process_time()
    print(json.dumps({"startup": t1 - t0, "simulate": t2 - t1, "write": t3 - t2,
                      "startup_cpu": c1 - c0, "simulate_cpu": c2 - c1, "write_cpu": c3 - c2,
                      "metrics": spent[0], "metrics_cpu": spent[1],
                      "steps": r.num_steps, "completed": r.summary["completed"],
                      "mean_ttft_ms": r.summary["mean_ttft_ms"],
                      "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
""")


def whole_process(scenario: Path, out: Path, extra: list[str]) -> dict:
    """`simserve run` in a fresh process: wall, CPU, peak RSS, bytes written."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "simserve", "run", str(scenario), "--out",
                             str(out), "--no-report", "--quiet", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = proc.communicate()
    if proc.returncode:
        sys.exit(f"simserve run failed:\n{stderr.decode()[-2000:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss * 1024,
            "bytes": sum(f.stat().st_size for f in out.iterdir())}


def phases(scenario: Path, out: Path, fast_forward: bool = True) -> dict:
    proc = subprocess.run([sys.executable, "-c", PHASES, str(scenario), str(out),
                           "1" if fast_forward else "0"], capture_output=True, text=True,
                          cwd=ROOT)
    if proc.returncode:
        sys.exit(f"benchmark run failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def pair(rows: list[dict], key: str) -> str:
    return f"{median(rows, key):5.2f}/{median(rows, key + '_cpu'):5.2f}"


def print_targets(n: int, whole: list[dict], parts: list[dict]) -> None:
    """Issue #21's targets for this size against the medians just printed."""
    got = {"wall": median(whole, "wall"), "rss_mb": median(whole, "rss") / 2**20,
           "simulate": median(parts, "simulate")}
    checks = [(what, got[key], limit) for what, key, limit in TARGETS.get(n, [])]
    checks.append(("start-up wall s", median(parts, "startup"), STARTUP_TARGET))
    print("    issue #21: " + "; ".join(
        f"{what} {value:,.2f} <= {limit:,g}: {'met' if value <= limit else 'NOT met'}"
        for what, value, limit in checks), flush=True)


def compile_bytecode() -> str:
    """Compile simserve's modules to bytecode before anything is timed, as a user's copy has
    them (pip compiles a package when it installs it; a checkout installed editable writes
    them at its first run). Otherwise, where nothing wrote them (``PYTHONDONTWRITEBYTECODE``
    set in the shell, a fresh clone), every timed process would compile the whole package
    from source first: about 0.1 s of start-up on our VM. What was done, for the header."""
    src = ROOT / "simserve"
    stale = [p for p in src.rglob("*.py")
             if not Path(importlib.util.cache_from_source(str(p))).exists()]
    if not compileall.compile_dir(str(src), quiet=1):
        sys.exit(f"could not compile {src} to bytecode")
    return f"{len(stale)} modules compiled now" if stale else "already"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=tuple(WORKLOADS), default="bench")
    ap.add_argument("--sizes", type=int, nargs="+")
    ap.add_argument("--policies", nargs="+")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; medians printed")
    ap.add_argument("--stepwise", type=int, nargs="*", default=[],
                    help="sizes also run stepwise (phases only) for the ratio, checked equal")
    ap.add_argument("--steps", action="store_true",
                    help="pass --steps to simserve run (write steps.csv in full)")
    ap.add_argument("--async", dest="async_", action="store_true",
                    help="engine.async_scheduling on in every run (the issues' targets, "
                         "set for synchronous runs, are not printed)")
    ap.add_argument("--replicas", type=int, default=1,
                    help="a cluster of this many replicas at as many times the rate (the "
                         "issues' targets, set for one replica, are not printed)")
    ap.add_argument("--router", default="round_robin", choices=ROUTERS,
                    help="the cluster's router")
    args = ap.parse_args()
    if args.replicas < 1:
        ap.error("--replicas: at least 1")
    one = args.replicas == 1 and not args.async_    # (the issues' targets apply)
    sizes = args.sizes or DEFAULT_SIZES[args.workload]
    policies = args.policies or DEFAULT_POLICIES[args.workload]
    if args.workload == "vidur" and not AZURE.exists():
        sys.exit(f"error: --workload vidur needs the Azure LLM inference trace 2023 "
                 f"(conversation), public at github.com/Azure/AzurePublicDataset, at {AZURE}")
    extra = ["--steps"] if args.steps else []
    compiled = compile_bytecode()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start "
          f"(timings inflate when the machine is busy); workload {args.workload}"
          f"{' with async scheduling' if args.async_ else ''}"
          f"{f', {args.replicas} replicas ({args.router})' if args.replicas > 1 else ''}, "
          f"medians of {args.repeat}")
    print("whole process: `simserve run --no-report --quiet`, wall and CPU seconds, peak RSS, "
          "output size;\nphases (wall / CPU seconds): start-up to the scenario loaded, "
          "simserve.run, of which the metrics (columns, summary), Result.save;\n"
          f"simserve's bytecode compiled first ({compiled}), as an installed copy has it")
    print(f"{'policy':8s} {'requests':>9s} | {'whole s':>7s} {'cpu s':>6s} {'RSS MB':>6s} "
          f"{'out MB':>6s} | {'start-up s':>11s} {'simulate s':>11s} {'metrics s':>11s} "
          f"{'write s':>11s} {'steps':>10s} | {'stepwise':>8s}")
    variants = VARIANTS.get(args.workload, [("", {})])
    with tempfile.TemporaryDirectory() as tmp:
        for policy in policies:
            for n in sizes:
                scens = {}
                for label, engine in variants:
                    raw = json.loads(json.dumps(WORKLOADS[args.workload]))
                    raw["scheduler"]["policy"] = policy
                    raw["engine"].update(engine)
                    if args.async_:
                        raw["engine"]["async_scheduling"] = True
                    if args.replicas > 1:
                        raw["cluster"] = {"replicas": args.replicas, "router": args.router}
                        raw["workload"]["rate"] *= args.replicas
                    raw["workload"]["num_requests"] = n
                    scen = scens[label] = Path(tmp) / f"{policy}-{n}-{len(scens)}.yaml"
                    scen.write_text(yaml.safe_dump(raw, sort_keys=False))
                # the variants in turn within each round (in the other order every other
                # round), so that a busy spell on the machine weighs on them alike
                whole = {label: [] for label, _ in variants}
                parts = {label: [] for label, _ in variants}
                for i in range(args.repeat):
                    for label, _ in (variants if i % 2 == 0 else variants[::-1]):
                        whole[label].append(whole_process(scens[label], Path(tmp) / f"w{i}",
                                                          extra))
                        parts[label].append(phases(scens[label], Path(tmp) / f"p{i}"))
                for label, _ in variants:
                    scen, w, ps = scens[label], whole[label], parts[label]
                    step_col = ""
                    if n in args.stepwise:
                        slow = phases(scen, Path(tmp) / "stepwise", fast_forward=False)
                        fast = ps[0]
                        if (slow["steps"], slow["mean_ttft_ms"]) != (fast["steps"],
                                                                      fast["mean_ttft_ms"]):
                            sys.exit(f"fast-forward and stepwise disagree for {policy} at {n}")
                        step_col = f"{slow['simulate'] / median(ps, 'simulate'):7.1f}x"
                    name = f"{policy} {label}" if label else policy
                    print(f"{name:8s} {n:9,d} | {median(w, 'wall'):7.2f} "
                          f"{median(w, 'cpu'):6.2f} {median(w, 'rss') / 2**20:6.0f} "
                          f"{median(w, 'bytes') / 2**20:6.1f} | "
                          f"{pair(ps, 'startup')} {pair(ps, 'simulate')} "
                          f"{pair(ps, 'metrics')} {pair(ps, 'write')} "
                          f"{ps[0]['steps']:10,d} | {step_col:>8s}",
                          flush=True)
                    if args.workload == "bench" and one:
                        print_targets(n, w, ps)
                if args.workload == "shared_prefix" and one:
                    # the ratio of each round's pair (run within seconds of each other), median
                    on, off = whole["cache on"], whole["cache off"]
                    ratio = statistics.median(a["wall"] / b["wall"] for a, b in zip(on, off))
                    top = PREFIX_TARGETS[0]
                    checks = [f"cache on / off whole process {ratio:.2f} (median of "
                              f"{len(on)} rounds' ratios; of the medians "
                              f"{median(on, 'wall') / median(off, 'wall'):.2f}) <= {top:g}: "
                              f"{'met' if ratio <= top else 'NOT met'}"]
                    if n == 10_000:
                        on_s, limit = median(on, "wall"), PREFIX_TARGETS[1]
                        checks.append(f"cache on whole process s {on_s:.2f} <= {limit:g}: "
                                      f"{'met' if on_s <= limit else 'NOT met'}")
                    print("    issue #31: " + "; ".join(checks), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
