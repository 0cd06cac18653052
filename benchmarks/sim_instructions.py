"""Instructions executed by a simulation, before and after a change: the reproducible speed
measure on a noisy shared machine (wall times drift by several per cent within minutes).

Runs ``simserve.run`` on one of the speed benchmark's workloads (benchmarks/sim_speed.py:
Llama-2-7B on an A100-80GB, roofline, Poisson 3 req/s; ``--workload vidur``, the default:
Azure-conversation lengths, or ``bench``: issue #21's normal lengths) under
``valgrind --tool=callgrind`` with a fixed hash seed and single-threaded BLAS, once for the
working tree (or a revision, ``--head``) and once for a git revision exported to a temporary
directory (``--base``), and
prints the instruction counts of the run itself (the whole process minus the same process
stopping before it, both after a 20-request run that imports every module a run needs).

    python benchmarks/sim_instructions.py --base main --requests 5000
    python benchmarks/sim_instructions.py --base 12fb67d --head HEAD --policies vllm_v1 --stepwise
    python benchmarks/sim_instructions.py --workload bench --policies vllm_v1 --requests 2000
    python benchmarks/sim_instructions.py --base 12fb67d --scenario scenarios/quickstart.yaml \
        --scenario scenarios/cluster_routing.yaml --set cluster.router=least_kv

With ``--scenario`` (repeatable) the runs are those scenario files instead (their ``compare:``
section dropped, ``--set`` applied to each, ``--requests``/``--policies`` only when given); the
file is read from the working tree, so base and head simulate the same input.

Needs valgrind, and the Azure conv trace (``--trace``; default ../shared/traces beside the
checkout, as sim_speed.py). Each callgrind run of 5,000 requests takes about a minute.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from sim_speed import WORKLOADS  # noqa: E402  (the speed benchmark's scenarios)

CHILD = textwrap.dedent("""
    import copy, json, sys
    from pathlib import Path
    import simserve
    from simserve.config import parse_scenario
    raw, fast_forward, run = json.loads(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
    base_dir = Path(sys.argv[4])
    # a run of 20 requests first: every module a run imports is imported (and compiled) and
    # the trace read, in both processes, so the difference is the big run alone
    small = copy.deepcopy(raw)
    small["workload"]["num_requests"] = 20
    simserve.run(parse_scenario(small, base_dir=base_dir), fast_forward=fast_forward)
    s = parse_scenario(raw, base_dir=base_dir)
    if run:
        r = simserve.run(s, fast_forward=fast_forward)
        print(r.num_steps, r.summary["mean_ttft_ms"])
""")


def callgrind(src: Path, raw: dict, fast_forward: bool, run: bool,
              base_dir: Path = ROOT) -> tuple[int, str]:
    """Instructions of one child process (and what it printed)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(src),
           "PYTHONDONTWRITEBYTECODE": "1"}
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/out",
             sys.executable, "-c", CHILD, json.dumps(raw), "1" if fast_forward else "0",
             "1" if run else "0", str(base_dir)], capture_output=True, text=True, cwd=src,
            env=env)
    if proc.returncode:
        sys.exit(f"callgrind run failed in {src}:\n{proc.stderr[-2000:]}")
    m = re.search(r"Collected : (\d+)", proc.stderr)
    if m is None:
        sys.exit(f"no instruction count in callgrind's output:\n{proc.stderr[-2000:]}")
    return int(m.group(1)), proc.stdout.strip()


def export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (simserve/ and profiler/ are all a run imports) under ``into``."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "simserve", "profiler"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _set(raw: dict, assignment: str) -> None:
    """``a.b.c=VALUE`` (VALUE read as YAML) into the raw scenario mapping."""
    import yaml
    key, _, value = assignment.partition("=")
    *parents, last = key.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = yaml.safe_load(value)


def cases(args: argparse.Namespace) -> list[tuple[str, dict, Path]]:
    """(label, raw scenario, base directory) of every run to measure."""
    import yaml
    out = []
    if args.scenario:
        for path in args.scenario:
            raw = yaml.safe_load(path.read_text())
            raw.pop("compare", None)
            for a in args.set:
                _set(raw, a)
            if args.requests:
                raw["workload"]["num_requests"] = args.requests
            for policy in args.policies or [raw["scheduler"]["policy"]]:
                r = json.loads(json.dumps(raw))
                r["scheduler"]["policy"] = policy
                out.append((f"{path.stem}:{policy}", r, path.resolve().parent))
        return out
    workload = WORKLOADS[args.workload]
    if "lengths" in workload["workload"] and not args.trace.exists():
        sys.exit(f"needs the Azure conv trace at {args.trace} (--trace)")
    for policy in args.policies or ["vllm_v0", "vllm_v1", "sarathi"]:
        raw = json.loads(json.dumps(workload))
        raw["scheduler"]["policy"] = policy
        raw["workload"]["num_requests"] = args.requests or 5000
        if "lengths" in raw["workload"]:
            raw["workload"]["lengths"]["path"] = str(args.trace)
        out.append((policy, raw, ROOT))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="git revision to compare with")
    ap.add_argument("--head", help="git revision measured instead of the working tree")
    ap.add_argument("--workload", choices=tuple(WORKLOADS), default="vidur",
                    help="without --scenario: vidur (Azure-conv lengths; needs --trace) or "
                         "bench (issue #21's normal lengths)")
    ap.add_argument("--requests", type=int, help="requests per run (default: 5000, or the "
                                                 "scenario file's)")
    ap.add_argument("--policies", nargs="+", help="default: vllm_v0 vllm_v1 sarathi, or the "
                                                  "scenario file's")
    ap.add_argument("--scenario", type=Path, action="append", default=[],
                    help="measure this scenario file instead (repeatable)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="with --scenario: override a field of each file (repeatable)")
    ap.add_argument("--stepwise", action="store_true", help="also measure stepping")
    ap.add_argument("--trace", type=Path,
                    default=ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    args = ap.parse_args()
    runs = cases(args)
    modes = [True, False] if args.stepwise else [True]
    with tempfile.TemporaryDirectory() as d:
        base = export(args.base, Path(d) / "base")
        head = export(args.head, Path(d) / "head") if args.head else ROOT
        print(f"instructions of simserve.run (base {args.base}, head "
              f"{args.head or 'the working tree'})")
        print(f"{'run':28s} {'mode':12s} {'base M':>9s} {'head M':>9s} {'change':>8s}")
        for label, raw, base_dir in runs:
            for ff in modes:
                counts, outs = [], []
                for src in (base, head):
                    total, out = callgrind(src, raw, ff, True, base_dir)
                    setup, _ = callgrind(src, raw, ff, False, base_dir)
                    counts.append(total - setup)
                    outs.append(out)
                if outs[0] != outs[1]:
                    sys.exit(f"{label}: base and head disagree: {outs[0]} vs {outs[1]}")
                b, t = counts
                print(f"{label:28s} {'fast-forward' if ff else 'stepwise':12s} {b / 1e6:9.1f} "
                      f"{t / 1e6:9.1f} {100 * (t - b) / b:+7.2f} %", flush=True)


if __name__ == "__main__":
    main()
