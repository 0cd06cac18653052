"""``simserve serve`` measured by its clients: our ``simserve replay`` and vLLM's own ``vllm bench
serve`` (docs/serve.md).

    python benchmarks/serve_bench.py agreement [--streams 100] [--seconds 60]
    python benchmarks/serve_bench.py vllm [--vllm-python /tmp/vllm-venv/bin/python]
    python benchmarks/serve_bench.py load [--streams 200] [--seconds 300]
    python benchmarks/serve_bench.py leak [--requests 6000]

``agreement``: a scenario whose load keeps about ``--streams`` streams open is served and
replayed; printed: each token's *delivery delay* (the client's receipt minus the simulated time
the step that sampled it ended, both on CLOCK_MONOTONIC: ``simserve serve --record`` and the
replay write their clocks' origins), the request-level differences between the replay and
``simserve run`` of the same scenario, and the two summaries side by side.

``vllm``: the tiny CPU model's scenario (scenarios/tiny_cpu_profile.yaml) served with
``--text-tokens words`` and driven by ``vllm bench serve`` (random dataset, the tiny model's
word-level tokenizer written by benchmarks/tiny_model.py, ``--ignore-eos``), run as a
module call because the CPU build's console script fails; vLLM's numbers are printed beside
``simserve run`` of the same load (the scenario's lengths, vLLM's Poisson rate) and of the
arrivals the server recorded.

``load``: ``--streams`` concurrent streams for ``--seconds``; the server's RSS sampled every 5 s
and the delivery delay per minute (drift shows as a trend in either).

``leak``: the Python memory (tracemalloc) the server holds after each third of ``--requests``
streamed requests, served in one process: what RSS cannot tell apart from the allocator.

Timings depend on the machine (ours: 2 shared cores); run on a quiet machine (``uptime``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent

# Llama-3.1-8B on an L40S: ~30-50 ms decode steps at 100-200 sequences, so that the token rate
# (streams x 1 / step) stays within what two shared cores can stream and read in Python.
AGREEMENT = """\
name: serve_agreement
seed: 0
model: Llama-3.1-8B
hardware: L40S
engine: {{max_num_seqs: 256, max_num_batched_tokens: 4096, block_size: 16, max_model_len: 8192}}
scheduler: {{policy: vllm_v1}}
latency: {{model: roofline}}
workload:
  arrival: poisson
  rate: {rate}
  duration: {seconds}
  prompt: {{dist: lognormal, mean: 600, sigma: 0.6, max: 4000}}
  output: {{dist: uniform, low: 150, high: 450}}
"""


def rate_for(streams: int) -> float:
    """The arrival rate that keeps about ``streams`` requests open (Little's law): 300 output
    tokens a request at the roofline's decode step for that batch, ~30 ms + 0.25 ms a sequence
    (measured off this scenario's runs)."""
    return round(streams / (300 * (0.030 + 0.00025 * streams)), 3)


def start_server(scenario: Path, cwd: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "simserve.cli", "serve", str(scenario),
                             "--port", "0", *extra], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        proc.kill()
        raise SystemExit(f"server did not start: {line}{proc.stderr.read()}")
    return proc, line.split(" on ")[-1].strip()


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    if proc.returncode != 0:
        raise SystemExit(f"server exited with {proc.returncode}")


def replay(scenario: Path, url: str, out: Path) -> None:
    subprocess.run([sys.executable, "-m", "simserve.cli", "replay", str(scenario), "--endpoint",
                    url, "--out", str(out), "--warmup", "0", "--quiet"], check=True)


def trace_scenario(base: str, trace: Path, path: Path) -> Path:
    head = base.split("\nworkload:")[0]
    path.write_text(f"{head}\nworkload: {{trace: {trace}, format: csv}}\n")
    return path


# --------------------------------------------------------------------------------------------
# Matching the client's requests to the server's


def match(client: pd.DataFrame, served: pd.DataFrame) -> pd.DataFrame:
    """Pairs (client request id, server request id): the same prompt and output lengths, in
    sending order within equal lengths (the server numbers requests in arrival order)."""
    c = client.sort_values("arrival_s").assign(
        k=lambda d: d.groupby(["num_prompt_tokens", "num_output_tokens"]).cumcount())
    s = served.sort_values("request_id").assign(
        k=lambda d: d.groupby(["num_prompt_tokens", "num_output_tokens"]).cumcount())
    m = c.merge(s, on=["num_prompt_tokens", "num_output_tokens", "k"], suffixes=("", "_srv"))
    if len(m) != len(c):
        raise SystemExit(f"matched {len(m)} of {len(c)} requests to the server's record")
    return m[["request_id", "request_id_srv"]]


def delivery_delays(rep: Path, rec: Path, base: str, work: Path) -> pd.DataFrame:
    """Every token: client receipt minus the simulated end of the step that sampled it (s), with
    the token's simulated time (for drift)."""
    from simserve.config import load_scenario
    from simserve.runner import run
    client = pd.read_csv(rep / "requests.csv")
    served = pd.read_csv(rec / "served.csv")
    pairs = match(client[client["status"] == "finished"], served)
    sim = run(load_scenario(trace_scenario(base, rec / "trace.csv", work / "trace.yaml")),
              record_tokens=True).tokens()
    got = pd.read_csv(rep / "tokens.csv")
    origin_c = json.loads((rep / "replay.json").read_text())["clock_origin_s"]
    origin_s = json.loads((rec / "record.json").read_text())["clock_origin_s"]
    got = got.merge(pairs, on="request_id").merge(
        sim.rename(columns={"request_id": "request_id_srv", "time_s": "sim_s"}),
        on=["request_id_srv", "token_index"])
    got["delay_s"] = (origin_c + got["time_s"]) - (origin_s + got["sim_s"])
    return got


def pct(x, qs=(50, 90, 99, 100)) -> str:
    x = np.asarray(x, float) * 1000.0
    return "  ".join(f"p{q} {np.percentile(x, q):8.3f}" for q in qs) + " ms"


def side_by_side(rows: dict[str, dict], keys) -> str:
    names = list(rows)
    out = [f"{'metric':20s}" + "".join(f"{n:>25s}" for n in names)]
    for k in keys:
        out.append(f"{k:20s}" + "".join(
            f"{rows[n].get(k, float('nan')):25.3f}" for n in names))
    return "\n".join(out)


SUMMARY_KEYS = ("completed", "request_throughput", "output_throughput", "mean_ttft_ms",
                "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms",
                "p99_e2el_ms")


def in_flight(requests: pd.DataFrame) -> float:
    """Mean number of requests open on the client (Little's law over the run)."""
    ok = requests[requests["status"] == "finished"]
    span = (ok["arrival_s"] + ok["e2el_s"]).max() - ok["arrival_s"].min()
    return float(ok["e2el_s"].sum() / span)


# --------------------------------------------------------------------------------------------


def cmd_agreement(args) -> None:
    from simserve.config import load_scenario
    from simserve.runner import run
    work = Path(args.out or tempfile.mkdtemp(prefix="serve_agreement_"))
    work.mkdir(parents=True, exist_ok=True)
    base = AGREEMENT.format(rate=args.rate or rate_for(args.streams), seconds=args.seconds)
    path = work / "scenario.yaml"
    path.write_text(base)
    proc, url = start_server(path, work, "--record", "rec")
    try:
        replay(path, url, work / "rep")
    finally:
        stop_server(proc)
    got = delivery_delays(work / "rep", work / "rec", base, work)
    client = pd.read_csv(work / "rep" / "requests.csv").set_index("request_id")
    predicted = run(load_scenario(path))
    pred = predicted.requests.set_index("request_id")
    rep_summary = json.loads((work / "rep" / "summary.json").read_text())
    meta = json.loads((work / "rep" / "replay.json").read_text())
    print(f"load average before / after: {meta['load_average_before']} / "
          f"{[round(x, 2) for x in os.getloadavg()]}")
    print(f"requests {len(client)}, streams open on average {in_flight(client.reset_index()):.1f}"
          f", tokens {len(got):,}")
    print(f"delivery delay per token (client receipt - simulated emission): {pct(got['delay_s'])}")
    print(f"  (negative: {(got['delay_s'] < 0).sum()} tokens)")
    for col in ("ttft_s", "tpot_s", "e2el_s"):
        d = (client[col] - pred[col]).dropna()
        print(f"replay - simserve run, {col[:-2]:5s}: {pct(d.abs())}  (signed median "
              f"{d.median() * 1000:+.3f} ms)")
    print(side_by_side({"simserve run": predicted.summary, "replay of serve": rep_summary},
                       SUMMARY_KEYS))
    print(f"files in {work}/")


def cmd_load(args) -> None:
    work = Path(args.out or tempfile.mkdtemp(prefix="serve_load_"))
    work.mkdir(parents=True, exist_ok=True)
    base = AGREEMENT.format(rate=args.rate or rate_for(args.streams), seconds=args.seconds)
    path = work / "scenario.yaml"
    path.write_text(base.replace("serve_agreement", "serve_load"))
    proc, url = start_server(path, work, "--record", "rec")
    rss: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        t0 = time.monotonic()
        while not done.is_set():
            try:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss.append((time.monotonic() - t0, int(line.split()[1])))
            except OSError:
                return
            done.wait(5.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        replay(path, url, work / "rep")
    finally:
        done.set()
        stop_server(proc)
    got = delivery_delays(work / "rep", work / "rec", base, work)
    client = pd.read_csv(work / "rep" / "requests.csv")
    print(f"requests {len(client)} ({(client['status'] != 'finished').sum()} failed), streams "
          f"open on average {in_flight(client):.1f}, tokens {len(got):,}")
    got["minute"] = (got["sim_s"] // 60).astype(int)
    print("minute  tokens   delay p50 ms   p99 ms   max ms")
    for m, g in got.groupby("minute"):
        d = g["delay_s"].to_numpy() * 1000
        print(f"{m:6d} {len(g):8d} {np.percentile(d, 50):13.3f} {np.percentile(d, 99):8.3f} "
              f"{d.max():8.3f}")
    r = pd.DataFrame(rss, columns=["t_s", "rss_kb"])
    r.to_csv(work / "rss.csv", index=False)
    print("server RSS (MiB) at " + ", ".join(
        f"{t:.0f} s: {kb / 1024:.1f}" for t, kb in r.iloc[::max(len(r) // 8, 1)].itertuples(
            index=False)) + f"; last {r['rss_kb'].iloc[-1] / 1024:.1f}")
    half = r[r["t_s"] >= r["t_s"].max() / 2]
    slope = np.polyfit(half["t_s"], half["rss_kb"] / 1024, 1)[0] * 60 if len(half) > 2 else 0
    print(f"RSS trend over the second half: {slope:+.2f} MiB/min")
    print(f"files in {work}/")


def cmd_vllm(args) -> None:
    from simserve.config import load_scenario
    from simserve.runner import run
    work = Path(args.out or tempfile.mkdtemp(prefix="serve_vllm_"))
    work.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "scenarios" / "tiny_cpu_profile.yaml").read_text()
    path = work / "scenario.yaml"
    # the load vLLM's client will send: fixed lengths (range ratio 0), Poisson at the rate
    head = text.split("\nworkload:")[0] + "\n"
    path.write_text(head + (
        f"workload:\n  arrival: poisson\n  rate: {args.rate}\n  num_requests: {args.num_prompts}"
        f"\n  prompt: {{dist: fixed, value: {args.input_len}}}\n  output: {{dist: fixed, value: "
        f"{args.output_len}}}\n"))
    proc, url = start_server(path, work, "--record", "rec", "--text-tokens", "words")
    bench = (
        "import sys\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "from vllm.benchmarks.serve import add_cli_args, main\n"
        "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")
    cmd = [args.vllm_python, "-c", bench, "--backend", "vllm", "--base-url", url,
           "--model", args.tokenizer, "--served-model-name", "tiny-llama-45m",
           "--tokenizer", args.tokenizer, "--dataset-name", "random",
           "--random-input-len", str(args.input_len), "--random-output-len",
           str(args.output_len), "--random-range-ratio", "0", "--num-prompts",
           str(args.num_prompts), "--request-rate", str(args.rate), "--ignore-eos", "--seed",
           "0", "--save-result", "--save-detailed", "--result-dir", str(work),
           "--result-filename", "vllm_bench.json", "--percentile-metrics", "ttft,tpot,itl,e2el"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    finally:
        stop_server(proc)
    if out.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    (work / "vllm_bench.log").write_text(out.stdout)
    vb = json.loads((work / "vllm_bench.json").read_text())
    same_load = run(load_scenario(path)).summary
    given = run(load_scenario(trace_scenario(path.read_text(), work / "rec" / "trace.csv",
                                             work / "trace.yaml"))).summary
    served = pd.read_csv(work / "rec" / "served.csv")
    print(f"vllm bench serve: {vb['completed']} requests, {vb['total_input_tokens']} input "
          f"tokens ({args.num_prompts} x {args.input_len} asked), {vb['total_output_tokens']} "
          f"output tokens; the server saw {len(served)} requests, prompts "
          f"{sorted(set(served['num_prompt_tokens']))}")
    print(side_by_side({"vllm bench serve": vb, "simserve run (load)": same_load,
                        "simserve run (arrivals)": given}, SUMMARY_KEYS))
    print(f"files in {work}/")


LEAK = """\
name: serve_leak
model: Llama-3.1-8B
hardware: H100-SXM
engine: {max_num_seqs: 256, max_num_batched_tokens: 8192, max_model_len: 4096}
scheduler: {policy: vllm_v1}
latency: {model: constant, step_ms: 1}
workload: {arrival: poisson, rate: 1, num_requests: 1, prompt: {dist: fixed, value: 10},
           output: {dist: fixed, value: 10}}
"""


def cmd_leak(args) -> None:
    """Python objects the server keeps: ``--requests`` streamed requests through the HTTP
    front end and the simulation in one process (1 ms steps), traced memory after each third."""
    import asyncio
    import gc
    import tracemalloc

    import aiohttp
    from aiohttp.test_utils import TestServer

    from simserve.config import load_scenario
    from simserve.live.driver import WallClockSimulation
    from simserve.live.http import Frontend
    work = Path(tempfile.mkdtemp(prefix="serve_leak_"))
    (work / "s.yaml").write_text(LEAK)
    scenario = load_scenario(work / "s.yaml")

    async def main() -> list[float]:
        sim = WallClockSimulation(scenario)
        server = TestServer(Frontend(sim).app())
        await server.start_server()
        url = str(server.make_url("/v1/completions"))
        traced = []
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            async def one(i: int) -> None:
                body = {"prompt": [5] * (100 + i % 300), "max_tokens": 5 + i % 20,
                        "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}
                async with session.post(url, json=body) as r:
                    async for _ in r.content:
                        pass

            tasks: set = set()
            third = args.requests // 3
            for i in range(3 * third):
                t = asyncio.create_task(one(i))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                await asyncio.sleep(0.001)
                if (i + 1) % third == 0:
                    while tasks:
                        await asyncio.sleep(0.01)
                    gc.collect()
                    traced.append(tracemalloc.get_traced_memory()[0] / 2**20)
        await server.close()
        return traced

    tracemalloc.start()
    traced = asyncio.run(main())
    third = args.requests // 3
    print("traced Python memory after " + ", ".join(
        f"{third * (k + 1)} requests: {mib:.3f} MiB" for k, mib in enumerate(traced)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("agreement")
    a.add_argument("--streams", type=int, default=100)
    a.add_argument("--seconds", type=float, default=60.0)
    a.add_argument("--rate", type=float, help="arrival rate (default: from --streams)")
    a.add_argument("--out")
    lo = sub.add_parser("load")
    lo.add_argument("--streams", type=int, default=200)
    lo.add_argument("--seconds", type=float, default=300.0)
    lo.add_argument("--rate", type=float, help="arrival rate (default: from --streams)")
    lo.add_argument("--out")
    v = sub.add_parser("vllm")
    v.add_argument("--vllm-python", default="/tmp/vllm-venv/bin/python")
    v.add_argument("--tokenizer", default="/tmp/tiny-llama",
                   help="the tiny model's directory (benchmarks/tiny_model.py writes it)")
    v.add_argument("--rate", type=float, default=4.0)
    v.add_argument("--num-prompts", type=int, default=200)
    v.add_argument("--input-len", type=int, default=256)
    v.add_argument("--output-len", type=int, default=64)
    v.add_argument("--out")
    k = sub.add_parser("leak")
    k.add_argument("--requests", type=int, default=6000)
    args = p.parse_args()
    {"agreement": cmd_agreement, "load": cmd_load, "vllm": cmd_vllm,
     "leak": cmd_leak}[args.cmd](args)


if __name__ == "__main__":
    main()
