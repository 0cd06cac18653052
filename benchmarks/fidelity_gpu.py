"""Ground truth on a GPU (issue #16): real vLLM on the lent H100 against simserve's prediction.

One script, run stage by stage, one device call per stage (each well inside the device tool's
10 minutes a call; 30 minutes a session). The CPU-side twin of this campaign is
``fidelity_vllm.py``; the shared pieces are in ``fidelity_campaign.py``.

What it does
------------
* Serves a model card (``--model``, Llama-3.1-8B by default) with vLLM 0.24.0 (staged by
  ``gpu_stage_vllm.py`` into /tmp/site) on 127.0.0.1: a ``config.json`` written from the card
  (``hf_config.py``), ``--load-format dummy --skip-tokenizer-init`` (token-id prompts), the
  engine knobs as a user runs them (vLLM's defaults: chunked prefill, CUDA graphs, async
  scheduling as 0.24.0 defaults it), prefix caching off, ``--max-model-len 8192`` (the shipped
  profile's grid). ``max_num_seqs`` 1,024 and ``max_num_batched_tokens`` 8,192 are what vLLM
  0.24.0 picks by itself for the API server on a >= 70 GiB GPU (``EngineArgs.get_batch_defaults``
  in ``vllm/engine/arg_utils.py``); they are passed explicitly so the simulator gets the same
  values, and the start-up log is checked against them.
* Measures the server's capacity (a burst of the workload's lengths) and sets the loads from
  it: light 20 %, moderate 70 %, saturating 150 % of capacity, and a real-trace-shaped load
  (``benchmarks/data/azure_conv_shape.csv``, our own resampling of the Azure 2023
  conversation trace's arrival gaps and length pairs, at 50 % of capacity).
* Calibrates simserve on probes of the server (``simserve.live.calibrate.calibrate``: single
  requests, decode batches, mixed steps, one open-loop load; never the workloads).
* Replays every workload ``--repeats`` times (3), then restarts the server with held-out knobs
  (``max_num_seqs`` 128, ``max_num_batched_tokens`` 2,048, never calibrated on) and replays
  the moderate and saturating loads again.
* ``report`` (on any machine, from the state): simulates every workload with (a) the shipped
  H100 profile alone and (b) the profile plus the probe calibration, prints per workload and
  metric (TTFT p50/p90, TPOT p50/p90, ITL p50, E2EL p50, output throughput) the real median,
  the real min-max, (a), (b) and the errors, and per step the real decode and mixed step times
  read off the token streams (as ``fidelity_gaps.py``) against the profile's price of the same
  steps (same batch, same contexts).

Stages and the device-call plan (times: estimates for Llama-3.1-8B on an H100, not readings)
--------------------------------------------------------------------------------------------
Before these: the 3 staging calls ``gpu_stage_vllm.py plan`` prints (about 1 minute each; the
first also starts the machine, 1-2 minutes). Every call below starts with
``export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1;`` and ends writing
``$OUT/state-<stage>.tgz`` (what the stage added to the state) and ``$OUT/<stage>.log``.

==========  =====================================================================  ========
call        command (``python3 benchmarks/fidelity_gpu.py --out $OUT ...``)         estimate
==========  =====================================================================  ========
G0          ``--stages serve,cold``: start vLLM (as G1), then issue #29's cold      6-8 min
            start: the same light load (2 req/s, 200 requests) twice on the fresh
            server, no warm-up request (``cold.json``; the report prints first
            against again); G1 then finds the server up
G1          ``--stages serve,capacity,calibrate``: write the config, start vLLM     5-7 min
            (a new session: it outlives the call), wait for /health (dummy
            weights, torch.compile, CUDA-graph capture: 2-3 min cold), capacity
            burst (~30 s), probe calibration (~2-3 min)
G2          ``--stages workloads``: light, moderate, saturating, trace x 3          6-8 min
            (each run bounded by its send span plus a drain; requests scaled
            down alike if the plan exceeds 480 s)
G3          ``--stages heldout,stop``: restart with the held-out knobs (1-2 min,    4-6 min
            compile cache warm), moderate and saturating x 3, stop the server
G4          ``--stages profile --profile-backends vllm_fa --profile-grid full        5-7 min
            --profile-limit 480`` (if >= 7 minutes are left): the shipped
            profiles' grid with ``--attention vllm_fa`` (vLLM's own FlashAttention
            with block tables), set against the shipped (FlexAttention) profile
            point by point and on the real steps; the current profiler's Flex
            re-measure (``--profile-backends flex``) is the next call's, if any
==========  =====================================================================  ========

With 15 minutes of device time a task (the device tool's grant since 2026-11; the plan above
needs about 30), split the campaign over sessions, each carrying the earlier calls' ``state-*.tgz``
and ``compile-cache.tgz`` back with ``--resume`` (finished stages are skipped; the staging
calls are repeated on each fresh machine): (A) staging, G1, G2 with ``--only light,moderate``;
(B) staging, ``--stages serve,workloads --only saturating,trace`` (the server restarted from
the compile cache), G3; (C) staging, G4. Each is an estimate of 12-15 minutes: check ``status``
before each call and stop a session's plan where fewer than 4 minutes would be left.

Then, here: ``--stages report --resume DIR`` with DIR holding the ``state-*.tgz`` files the
calls brought back. The state lives in ``--state`` (default /tmp/fidelity-gpu/state on the
device, kept while the machine is warm). If the machine went back between calls, the next call
carries the earlier ``state-*.tgz`` files and ``compile-cache.tgz`` (vLLM's torch.compile
artifacts, written by ``serve`` when they pack under 15 MiB) in an ignored folder, e.g.
``.gpu-stage/state``, and passes ``--resume .gpu-stage/state``: finished stages are not run
again, and a server that is not answering is started again (its compile cache restored; the
CUDA graphs are captured again).

``--rehearse`` runs the same stages against vLLM's CPU build here (/tmp/vllm-venv, the tiny
model's card, 32-token blocks, short workloads, the tiny model's CPU profile as the "shipped
profile"): it checks the plumbing, not the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import fidelity_campaign as fc  # noqa: E402
from hf_config import write_model_dir  # noqa: E402
from simserve.live.calibrate import (ProbePlan, calibrate, format_calibration,  # noqa: E402
                                load_steps, write_calibrated)
from simserve.live.replay import replay  # noqa: E402

STAGES = ("serve", "cold", "capacity", "calibrate", "workloads", "heldout", "stop", "profile",
          "report")
TRACE_SHAPE = ROOT / "benchmarks/data/azure_conv_shape.csv"
LOAD_FRACTIONS = {"light": 0.2, "moderate": 0.7, "saturating": 1.5, "trace": 0.5}


@dataclass(frozen=True)
class Mode:
    """Everything that differs between the GPU campaign and its CPU rehearsal."""

    name: str
    python: str                          # the interpreter that runs vLLM
    card: str
    hardware: str
    profile: Path                        # (a): the shipped profile of this card and device
    block_size: int
    max_model_len: int
    knobs: dict
    held_out: dict
    server_args: tuple[str, ...]
    env: dict
    prompt: tuple[int, int]              # uniform prompt lengths of the synthetic loads
    output: tuple[int, int]
    requests: dict                       # per workload
    capacity_requests: int
    probe: ProbePlan
    trace_divisor: tuple[int, int]       # trace prompt and output lengths divided by these
    port: int = 8041
    health_timeout: float = 540.0
    run_limit: float = 120.0             # seconds the capacity burst may send for
    drain_s: float = 30.0                # after a run's last send, for what is still running
    budget_s: dict = field(default_factory=lambda: {"workloads": 480.0, "heldout": 300.0})
    min_requests: int = 40
    repeats: int = 3
    quiet_limit: float = 99.0            # load average to wait for (the GPU machine: none)
    profile_args: tuple[str, ...] = ()
    cold: tuple[float, int] = (2.0, 200)  # the cold stage's Poisson rate and requests a run


def gpu_mode() -> Mode:
    site = os.environ.get("VLLM_SITE", "/tmp/site")
    return Mode(
        name="gpu", python="python3", card="Llama-3.1-8B", hardware="H100-SXM",
        profile=ROOT / "simserve/data/profiles/Llama-3.1-8B_H100-SXM_bf16.json",
        block_size=16, max_model_len=8192,
        knobs={"max_num_seqs": 1024, "max_num_batched_tokens": 8192},
        held_out={"max_num_seqs": 128, "max_num_batched_tokens": 2048},
        server_args=("--dtype", "bfloat16", "--load-format", "dummy", "--skip-tokenizer-init",
                     "--no-enable-prefix-caching", "--enable-chunked-prefill", "--seed", "0",
                     "--disable-uvicorn-access-log"),
        env={"PYTHONPATH": f"{site}:{ROOT}", "HF_HUB_OFFLINE": "1",
             "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"},
        prompt=(128, 2048), output=(32, 512),
        requests={"light": 120, "moderate": 300, "saturating": 300, "trace": 300},
        capacity_requests=400,
        probe=ProbePlan(prompt_lens=(16, 128, 512, 1024, 2048, 4096, 7000),
                        concurrencies=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                        batch_prompt=256, batch_output=64, long_batch_prompts=(2048,),
                        mixed_prompts=(32, 128, 512, 2048), mixed_stream=(512, 128),
                        repeats=3, load_requests=200, load_prompt=(64, 2048),
                        load_output=(32, 256)),
        trace_divisor=(1, 1), run_limit=100.0, drain_s=30.0, health_timeout=420.0,
        profile_args=("--device", "cuda", "--grid", "quick", "--max-num-batched-tokens", "8192",
                      "--max-model-len", "8192", "--max-num-seqs", "256"))


def rehearse_mode() -> Mode:
    return Mode(
        name="rehearse", python="/tmp/vllm-venv/bin/python", card="tiny-llama-45m",
        hardware="cpu-epyc-2core",
        profile=ROOT / "simserve/data/profiles/tiny-llama-45m_cpu-epyc-2core_bf16_1t.json",
        block_size=32, max_model_len=2048,
        knobs={"max_num_seqs": 32, "max_num_batched_tokens": 512},
        held_out={"max_num_seqs": 8, "max_num_batched_tokens": 256},
        server_args=("--dtype", "bfloat16", "--load-format", "dummy", "--skip-tokenizer-init",
                     "--no-enable-prefix-caching", "--enable-chunked-prefill", "--seed", "0",
                     "--disable-uvicorn-access-log", "--block-size", "32"),
        env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        prompt=(32, 384), output=(16, 48),
        requests={"light": 6, "moderate": 16, "saturating": 16, "trace": 16},
        capacity_requests=24,
        probe=ProbePlan(prompt_lens=(16, 128, 384), concurrencies=(1, 4, 8),
                        long_batch_prompts=(), mixed_prompts=(32, 128), repeats=1,
                        batch_output=32, load_requests=30, load_rate=4.0),
        trace_divisor=(4, 4), port=8042, run_limit=90.0, repeats=3, quiet_limit=4.0,
        cold=(0.5, 12),
        drain_s=60.0, budget_s={"workloads": 2400.0, "heldout": 1500.0}, min_requests=6,
        profile_args=("--device", "cpu", "--grid", "quick", "--threads", "1",
                      "--max-num-batched-tokens", "512", "--max-model-len", "2048",
                      "--max-num-seqs", "32", "--block-size", "32"))


# --------------------------------------------------------------------------------------------
# State: a directory of small files; each stage packs what it added into $OUT/state-<stage>.tgz


class State:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.root / name

    def read(self, name: str) -> dict | None:
        p = self.path(name)
        return json.loads(p.read_text()) if p.exists() else None

    def write(self, name: str, data: dict) -> None:
        self.path(name).write_text(json.dumps(data, indent=1, default=fc.plain) + "\n")

    def done(self, stage: str) -> bool:
        return self.path(f"done-{stage}").exists()

    def mark(self, stage: str) -> None:
        self.path(f"done-{stage}").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n",
                                                            time.gmtime()))

    def pack(self, name: str, out: Path, since: float) -> Path:
        """Every state file changed since ``since`` into ``out/state-<name>.tgz`` (one file of
        the at most 8, 16 MiB each, a device call brings back). ``tokens.csv`` stays out: the
        report reads ``chunks.csv``, which holds the same times."""
        out.mkdir(parents=True, exist_ok=True)
        target = out / f"state-{name}.tgz"
        with tarfile.open(target, "w:gz") as tar:
            for p in sorted(self.root.rglob("*")):
                if p.is_file() and p.name != "tokens.csv" and p.stat().st_mtime >= since - 1:
                    tar.add(p, arcname=str(p.relative_to(self.root)))
        return target

    def resume(self, folder: Path) -> list[str]:
        """Unpack every ``state-*.tgz`` of ``folder`` (carried back from earlier calls)."""
        found = sorted(folder.glob("state-*.tgz"))
        for f in found:
            with tarfile.open(f) as tar:
                tar.extractall(self.root, filter="data")
        return [f.name for f in found]


# --------------------------------------------------------------------------------------------
# The server


def server_cmd(mode: Mode, model_dir: Path, knobs: dict) -> list[str]:
    return [mode.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", mode.card, "--host", "127.0.0.1", "--port", str(mode.port),
            "--max-model-len", str(mode.max_model_len),
            "--max-num-seqs", str(knobs["max_num_seqs"]),
            "--max-num-batched-tokens", str(knobs["max_num_batched_tokens"]),
            *mode.server_args]


def resolved_knobs(log: str) -> dict:
    """What the server's start-up log says it runs with (None where it says nothing)."""
    def last(pattern: str) -> str | None:
        m = re.findall(pattern, log)
        return m[-1] if m else None
    return {"max_num_batched_tokens": last(r"max_num_batched_tokens=(\d+)"),
            "max_num_seqs": last(r"max_num_seqs=(\d+)"),
            "block_size": last(r"block_size=(\d+)"),
            "async_scheduling": last(r"async_scheduling=(\w+)"),
            "cudagraph_mode": last(r"cudagraph_mode['\"]?[:=]\s*['<]?(?:CUDAGraphMode\.)?(\w+)"),
            "attention_backend": last(r"Using (\w+) (?:attention )?backend"),
            "engine_version": last(r"vLLM API server version ([\w.+]+)")
            or last(r"\(v([\d.]+\w*)\)")}


def cache_root(state: State) -> Path:
    """vLLM's cache (``VLLM_CACHE_ROOT``: torch.compile artifacts) beside the state."""
    return state.root.parent / "vllm-cache"


def pack_compile_cache(state: State, out: Path, limit: int = 15 << 20) -> Path | None:
    """vLLM's compile cache into ``out/compile-cache.tgz`` (a fresh machine that gets it back
    skips the compile, not the CUDA-graph capture), if it packs under ``limit`` bytes."""
    root = cache_root(state)
    if not root.exists():
        return None
    out.mkdir(parents=True, exist_ok=True)
    target = out / "compile-cache.tgz"
    with tarfile.open(target, "w:gz") as tar:
        tar.add(root, arcname="vllm-cache")
    if target.stat().st_size > limit:
        print(f"compile cache packs to {target.stat().st_size >> 20} MiB > {limit >> 20} MiB: "
              f"not kept", file=sys.stderr)
        target.unlink()
        return None
    return target


def start_server(mode: Mode, state: State, knobs: dict, label: str) -> dict:
    """Start vLLM (its own session: it outlives this call on the device) and record it."""
    model_dir = write_model_dir(mode.card, state.root / "model")
    log = state.path(f"server-{label}.log")
    env = {**os.environ, **mode.env, "VLLM_CACHE_ROOT": str(cache_root(state))}
    srv = fc.Server(server_cmd(mode, model_dir, knobs), env, mode.port, log,
                    health_timeout=mode.health_timeout, keep=True)
    with srv:
        text = srv.log_text()
        info = {"label": label, "pid": srv.pid, "boot_id": boot_id(), "port": mode.port,
                "knobs": knobs,
                "kv_tokens": srv.kv_tokens(), "start_s": round(srv.start_s, 1),
                "cmd": srv.cmd, "resolved": resolved_knobs(text)}
    got = info["resolved"]["max_num_batched_tokens"]
    if got is not None and int(got) != knobs["max_num_batched_tokens"]:
        print(f"warning: the server log says max_num_batched_tokens={got}, the scenario uses "
              f"{knobs['max_num_batched_tokens']}", file=sys.stderr)
    if info["kv_tokens"] is None:
        print(f"warning: no 'KV cache size: N tokens' in {log}; the simulator gets the "
              f"profile's memory model", file=sys.stderr)
    state.write("server.json", info)
    print(f"server {label}: up in {info['start_s']} s, KV {info['kv_tokens']} tokens, "
          f"resolved {info['resolved']}", file=sys.stderr)
    return info


def ensure_server(mode: Mode, state: State, knobs: dict, label: str) -> dict:
    info = state.read("server.json")
    if info and info["label"] == label and fc.health(mode.port):
        return info
    stop_server(mode, state)
    return start_server(mode, state, knobs, label)


def boot_id() -> str:
    """This machine's boot: a PID recorded on another machine (state carried to a fresh one)
    must never be signalled."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def stop_server(mode: Mode, state: State) -> None:
    info = state.read("server.json")
    if info and info.get("boot_id") == boot_id():
        pidfile = state.path(f"server-{info['label']}.pid")
        if not pidfile.exists() and info.get("pid"):
            pidfile.write_text(f"{info['pid']}\n")
        fc.Server.stop_pidfile(pidfile)


# --------------------------------------------------------------------------------------------
# Workloads and scenarios


def lengths(mode: Mode) -> dict:
    return {"prompt": {"dist": "uniform", "low": mode.prompt[0], "high": mode.prompt[1]},
            "output": {"dist": "uniform", "low": mode.output[0], "high": mode.output[1]}}


def trace_csv(mode: Mode, state: State) -> Path:
    """The shipped trace shape, lengths divided for the mode and clipped to its context."""
    df = pd.read_csv(TRACE_SHAPE)
    out_max = max(1, min(mode.output[1] * 2, mode.max_model_len // 4))
    out = (df["output_tokens"] // mode.trace_divisor[1]).clip(4, out_max)
    prompt = (df["prompt_tokens"] // mode.trace_divisor[0]).clip(4, mode.max_model_len - out)
    path = state.path("trace.csv")
    pd.DataFrame({"arrival_s": df["arrival_s"], "prompt_tokens": prompt,
                  "output_tokens": out}).to_csv(path, index=False)
    return path


def workloads(mode: Mode, state: State, capacity_rps: float) -> dict[str, dict]:
    n = mode.requests
    rate = {k: round(f * capacity_rps, 3) for k, f in LOAD_FRACTIONS.items()}
    trace_csv(mode, state)
    return {
        "light": {"arrival": "poisson", "rate": rate["light"], "num_requests": n["light"],
                  **lengths(mode)},
        "moderate": {"arrival": "poisson", "rate": rate["moderate"],
                     "num_requests": n["moderate"], **lengths(mode)},
        "saturating": {"arrival": "poisson", "rate": rate["saturating"],
                       "num_requests": n["saturating"], **lengths(mode)},
        "trace": {"trace": "trace.csv", "format": "csv", "rate": rate["trace"],
                  "num_requests": n["trace"]},
    }


def send_span(w: dict, capacity_rps: float | None) -> float:
    """Seconds a run of workload ``w`` sends for, at most: its requests over its rate (or over
    the capacity, for a load above it: the queue drains at that speed)."""
    rate = w["rate"] if capacity_rps is None else min(w["rate"], capacity_rps)
    return w["num_requests"] / rate


def fit_budget(wls: dict[str, dict], repeats: int, drain_s: float, budget_s: float,
               min_requests: int, capacity_rps: float | None = None
               ) -> tuple[float, dict[str, dict]]:
    """The planned seconds of ``repeats`` runs of every workload (sends plus ``drain_s``
    each), and the workloads with fewer requests, scaled alike (at least ``min_requests``), if
    that plan exceeds ``budget_s``: one device call must end inside its 10 minutes."""
    planned = sum(repeats * (send_span(w, capacity_rps) + drain_s) for w in wls.values())
    if planned <= budget_s:
        return planned, wls
    sends = sum(repeats * send_span(w, capacity_rps) for w in wls.values())
    f = max(0.0, budget_s - repeats * drain_s * len(wls)) / sends
    return planned, {k: {**w, "num_requests": max(min_requests, int(w["num_requests"] * f))}
                     for k, w in wls.items()}


def scenario_of(mode: Mode, state: State, name: str, workload: dict, knobs: dict,
                profile: Path, kv_tokens: int | None):
    blocks = kv_tokens // mode.block_size if kv_tokens else None
    return fc.scenario(name, workload, knobs, {"model": "profile", "path": str(profile)},
                       blocks, state.root, model=mode.card, hardware=mode.hardware,
                       block_size=mode.block_size, max_model_len=mode.max_model_len)


# --------------------------------------------------------------------------------------------
# Stages that need the server


def stage_serve(mode: Mode, state: State, args) -> None:
    ensure_server(mode, state, mode.knobs, "default")
    pack_compile_cache(state, Path(args.out))


def stage_cold(mode: Mode, state: State, args) -> None:
    """Issue #29's cold start: is a fresh server's first load slower in its tail than the same
    load again? (The measured H100 runs' first stages have TTFT p99 / mean 1.78 against 1.23
    later, and publish no per-request data.) A light Poisson load of the synthetic lengths
    (``Mode.cold``), replayed twice with no warm-up request on a server nothing was sent to
    yet; each run's requests.csv (TTFT per request, in arrival order) and its TTFT mean / p90 /
    p99 in ``cold.json``. Refused once any other load has reached the server."""
    if any(state.path(k).exists() for k in ("capacity.json", "calibrated.json")) or any(
            state.done(f"default-{k}") for k in LOAD_FRACTIONS):
        raise SystemExit("error: cold: the server has served a load already (capacity, "
                         "calibration or workloads in the state); run --stages serve,cold on a "
                         "fresh state")
    info = ensure_server(mode, state, mode.knobs, "default")
    rate, n = mode.cold
    wl = {"arrival": "poisson", "rate": rate, "num_requests": n, **lengths(mode)}
    sc = scenario_of(mode, state, "cold", wl, mode.knobs, mode.profile, info["kv_tokens"])
    out = {"workload": wl}
    for run in ("first", "again"):
        res = replay(sc, f"http://127.0.0.1:{mode.port}", timeout=300,
                     time_limit=n / rate + mode.drain_s, warmup=0)
        res.save(state.path(f"cold-{run}"))
        sm = res.summary
        out[run] = {k: sm.get(k) for k in ("completed", "mean_ttft_ms", "p90_ttft_ms",
                                           "p99_ttft_ms", "mean_e2el_ms", "p99_e2el_ms")}
        print(f"cold {run}: TTFT mean {sm['mean_ttft_ms']:.1f} ms, p99 {sm['p99_ttft_ms']:.1f} "
              f"ms ({sm['completed']} requests)", file=sys.stderr)
    state.write("cold.json", out)


def stage_capacity(mode: Mode, state: State, args) -> None:
    """A burst of the synthetic loads' lengths: the completed requests per second it sustains
    set the loads' rates."""
    info = ensure_server(mode, state, mode.knobs, "default")
    wl = {"arrival": "burst", "num_requests": mode.capacity_requests, **lengths(mode)}
    sc = scenario_of(mode, state, "capacity", wl, mode.knobs, mode.profile, info["kv_tokens"])
    res = replay(sc, f"http://127.0.0.1:{mode.port}", timeout=300, time_limit=mode.run_limit,
                 warmup=2)
    res.save(state.path("capacity"))
    sm = res.summary
    cap = {"request_throughput": sm["request_throughput"],
           "output_throughput": sm["output_throughput"], "completed": sm["completed"],
           "num_requests": sm["num_requests"], "duration_s": sm["duration_s"],
           "rates": {k: round(f * sm["request_throughput"], 3)
                     for k, f in LOAD_FRACTIONS.items()}}
    state.write("capacity.json", cap)
    print(f"capacity: {cap['request_throughput']:.2f} req/s ({cap['completed']}/"
          f"{cap['num_requests']} in {cap['duration_s']:.1f} s); rates {cap['rates']}",
          file=sys.stderr)


def stage_calibrate(mode: Mode, state: State, args) -> None:
    info = ensure_server(mode, state, mode.knobs, "default")
    cap = state.read("capacity.json")
    # the load probe at about half the capacity: a loaded server, not a saturated one
    plan = mode.probe if cap is None else dataclasses.replace(
        mode.probe, load_rate=round(max(0.5, 0.5 * cap["request_throughput"]), 3))
    wl = {"arrival": "poisson", "rate": plan.load_rate, "num_requests": 10, **lengths(mode)}
    sc = scenario_of(mode, state, "calibration", wl, mode.knobs, mode.profile, info["kv_tokens"])
    t0 = time.time()
    prof = calibrate(sc, f"http://127.0.0.1:{mode.port}", plan=plan,
                     kv_tokens=info["kv_tokens"],
                     log=lambda line: print("  " + line, file=sys.stderr))
    write_calibrated(prof, state.path("calibrated.json"))
    text = format_calibration(prof["calibration"])
    state.path("calibration.txt").write_text(text + "\n")
    print(text, file=sys.stderr)
    print(f"calibration: {time.time() - t0:.0f} s", file=sys.stderr)


def _measure(mode: Mode, state: State, names: list[str], knobs: dict, label: str,
             args) -> None:
    info = ensure_server(mode, state, knobs, label)
    cap = state.read("capacity.json")
    if cap is None:
        raise SystemExit("error: no capacity.json in the state: run the capacity stage first "
                         "(or --resume the folder holding state-capacity.tgz)")
    capacity = cap["request_throughput"]
    repeats = args.repeats or mode.repeats
    todo = {k: w for k, w in workloads(mode, state, capacity).items()
            if k in names and not state.done(f"{label}-{k}")}
    stage = "heldout" if label == "heldout" else "workloads"
    planned, wls = fit_budget(todo, repeats, mode.drain_s, mode.budget_s[stage],
                              mode.min_requests, capacity)
    if wls != todo:
        print(f"planned {planned:.0f} s > this call's {mode.budget_s[stage]:.0f} s: requests "
              f"scaled to {({k: w['num_requests'] for k, w in wls.items()})}", file=sys.stderr)
    endpoint = f"http://127.0.0.1:{mode.port}"
    for name in names:
        key = f"{label}-{name}"
        if state.done(key):
            print(f"{key}: done already (state)", file=sys.stderr)
            continue
        t0 = time.time()
        sc = scenario_of(mode, state, name, wls[name], knobs, mode.profile, info["kv_tokens"])
        limit = send_span(wls[name], capacity) + mode.drain_s
        reals = fc.measure(key, sc, endpoint, repeats, state.root, time_limit=limit,
                           quiet_limit=mode.quiet_limit)
        state.write(f"real-{key}.json", {"workload": wls[name], "knobs": knobs,
                                         "kv_tokens": info["kv_tokens"], "summaries": reals})
        state.mark(key)
        state.pack(key, Path(args.out), t0)


def stage_workloads(mode: Mode, state: State, args) -> None:
    names = args.only or ["light", "moderate", "saturating", "trace"]
    _measure(mode, state, names, mode.knobs, "default", args)


def stage_heldout(mode: Mode, state: State, args) -> None:
    names = args.only or ["moderate", "saturating"]
    _measure(mode, state, names, mode.held_out, "heldout", args)


def stage_stop(mode: Mode, state: State, args) -> None:
    stop_server(mode, state)


def stage_profile(mode: Mode, state: State, args) -> None:
    """The profiler's quick grid with vLLM's own attention kernels and with FlexAttention."""
    env = {**os.environ, **mode.env}
    # rehearsal: vllm_fa only (it must refuse, clearly, without CUDA); a CPU quick grid of the
    # tiny model takes minutes, which the rehearsal does not need to spend
    backends = args.profile_backends or (["vllm_fa", "flex"] if mode.name == "gpu"
                                         else ["vllm_fa"])
    grid_args = [a for a in mode.profile_args]
    if args.profile_grid:
        grid_args[grid_args.index("--grid") + 1] = args.profile_grid
    for backend in backends:
        out = state.path(f"profile-{backend}.json")
        if out.exists():
            continue
        cmd = [mode.python, "-m", "profiler", "--model", mode.card, *grid_args,
               "--attention", backend, "--out", str(out),
               "--note", f"benchmarks/fidelity_gpu.py profile stage ({mode.name})"]
        t0 = time.time()
        try:
            r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                               timeout=args.profile_limit)
            text, code = r.stdout + r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            text = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(
                errors="replace")
            code = f"timeout after {args.profile_limit:.0f} s"
        state.path(f"profile-{backend}.log").write_text(text)
        print(f"profile {backend}: exit {code} after {time.time() - t0:.0f} s", file=sys.stderr)
        if code:
            print("".join(text.splitlines(True)[-8:]), file=sys.stderr)


# --------------------------------------------------------------------------------------------
# The report (any machine; no server)


def price_steps(steps, models: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Real decode and mixed steps (``simserve.live.calibrate.LoadSteps``) against each latency
    model's price of the same steps: same batch, same contexts, same prompt."""
    from simserve.sched.plan import StepPlan
    dec = []
    for sec, ctx in steps.decode:
        if ctx:
            b = len(ctx)
            plan = StepPlan(tuple(range(b)), (1,) * b, (), (), ctx, b)
            dec.append({"streams": b, "real": sec,
                        **{k: m.step_time(plan) for k, m in models.items()}})
    mix = []
    for prompt, sec, ctx in steps.mixed:
        b = len(ctx)
        plan = StepPlan(tuple(range(b + 1)), (*[1] * b, prompt), (prompt,), (0,), ctx, b + 1)
        mix.append({"prompt": prompt, "real": sec,
                    **{k: m.step_time(plan) for k, m in models.items()}})
    return _binned(pd.DataFrame(dec), "streams", models), \
        _binned(pd.DataFrame(mix), "prompt", models)


def _binned(df: pd.DataFrame, by: str, models: dict) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame()
    top = int(df[by].max())
    edges = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024] if by == "streams" else \
        [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    edges = [e for e in edges if e < top] + [top]
    g = df.groupby(pd.cut(df[by], edges), observed=True)
    out = pd.DataFrame({"n": g.size(), "real ms": g["real"].median() * 1e3})
    for k in models:
        out[f"{k} ms"] = g[k].median() * 1e3
        out[f"{k} err %"] = (out[f"{k} ms"] / out["real ms"] - 1) * 100
    out.index = [f"{iv.left + 1}-{iv.right}" for iv in out.index]
    out.index.name = by
    return out


GRIDS = {"linear": ("tokens",), "embedding": ("tokens",), "lm_head": ("seqs",),
         "attn_prefill": ("chunk", "ctx"), "attn_decode": ("batch", "ctx")}


def grid_ratios(base: dict, new: dict) -> pd.DataFrame:
    """Per profile part, ``new / base`` seconds over the grid points both measured: median,
    min, max and how many points."""
    rows = []
    for part, axes in GRIDS.items():
        if part not in base or part not in new:
            continue
        def points(p):
            secs = p[part]["seconds"]
            if len(axes) == 1:
                return dict(zip(p[part][axes[0]], secs))
            return {(a, b): secs[i][j] for i, a in enumerate(p[part][axes[0]])
                    for j, b in enumerate(p[part][axes[1]]) if secs[i][j] is not None}
        pb, pn = points(base), points(new)
        common = [k for k in pb if k in pn and pb[k] and pn[k]]
        if common:
            r = np.array([pn[k] / pb[k] for k in common])
            rows.append({"part": part, "points": len(common), "median": np.median(r),
                         "min": r.min(), "max": r.max()})
    return pd.DataFrame(rows).set_index("part") if rows else pd.DataFrame()


def streams_of(run_dir: Path) -> list[dict]:
    req = pd.read_csv(run_dir / "requests.csv")
    chunks = pd.read_csv(run_dir / "chunks.csv")
    prompts = dict(zip(req["request_id"], req["num_prompt_tokens"]))
    return [{"prompt": int(prompts[rid]), "times": g["time_s"].tolist(),
             "counts": g["num_tokens"].tolist()} for rid, g in chunks.groupby("request_id")]


def stage_report(mode: Mode, state: State, args) -> None:
    from simserve.latency.profile import ProfileLatency
    from simserve.cards import load_model
    out = Path(args.out)
    cal_path = state.path("calibrated.json")
    if not cal_path.exists():
        raise SystemExit(f"error: {cal_path}: no calibration in the state (run calibrate, or "
                         f"--resume the folder holding state-calibrate.tgz)")
    card = load_model(mode.card)
    models = {"(a) profile": ProfileLatency.from_file(mode.profile, card),
              "(b) calibrated": ProfileLatency.from_file(cal_path, card)}
    remeasured = {}
    for f in sorted(state.root.glob("profile-*.json")):    # the profile stage's, if it ran
        backend = f.stem[len("profile-"):]
        remeasured[backend] = json.loads(f.read_text())
        models[f"profile {backend}"] = ProfileLatency.from_file(f, card)
    cap = state.read("capacity.json")
    lines = [f"# simserve against vLLM ({mode.name}): {mode.card}, {mode.hardware}", "",
             f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; report run on "
             f"{os.cpu_count()} cores, {fc.cpu_name()}"
             + (f"; capacity burst {cap['request_throughput']:.2f} req/s" if cap else ""), ""]
    for info_name in ("server.json",):
        info = state.read(info_name)
        if info:
            lines.append(f"server: {info['resolved']}; KV {info['kv_tokens']} tokens")
    cold = state.read("cold.json")
    if cold:          # (the cold stage: a fresh server's first load against the same again)
        lines += ["", "cold start (the same light load twice on a fresh server, no warm-up):"]
        for run in ("first", "again"):
            c = cold[run]
            lines.append(f"  {run}: TTFT mean {c['mean_ttft_ms']:.1f} ms, p90 "
                         f"{c['p90_ttft_ms']:.1f}, p99 {c['p99_ttft_ms']:.1f} (p99 / mean "
                         f"{c['p99_ttft_ms'] / c['mean_ttft_ms']:.2f}); E2EL p99 "
                         f"{c['p99_e2el_ms']:.0f} ms; {c['completed']} requests")
    lines += ["", "calibration (probes only):", "```",
              state.path("calibration.txt").read_text().rstrip(), "```", ""]
    rows = []
    for real_json in sorted(state.root.glob("real-*.json")):
        key = real_json.stem[len("real-"):]
        data = json.loads(real_json.read_text())
        name = key.split("-", 1)[1]
        sc_a = scenario_of(mode, state, name, data["workload"], data["knobs"], mode.profile,
                           data["kv_tokens"])
        sc_b = scenario_of(mode, state, name, data["workload"], data["knobs"], cal_path,
                           data["kv_tokens"])
        sim_a = fc.simulate(key, sc_a, out, calibrated=False)
        sim_b = fc.simulate(key, sc_b, out, calibrated=True)
        knobs = data["knobs"]
        title = (f"{key}: max_num_seqs {knobs['max_num_seqs']}, max_num_batched_tokens "
                 f"{knobs['max_num_batched_tokens']}"
                 + (" (held out)" if key.startswith("heldout") else ""))
        text, r = fc.report(title, data["summaries"], sim_a, sim_b)
        rows.extend(r)
        run0 = state.root / "real" / key / "run0"
        dec, mix = price_steps(load_steps(streams_of(run0)), models)
        text += ("\n\nper step (run 0), real step times read off the token streams against "
                 "each model's price of the same steps:\n\ndecode steps, by streams:\n\n"
                 + (dec.round(2).to_string() if not dec.empty else "(none)")
                 + "\n\nmixed steps (a newcomer's prompt beside decodes), by prompt tokens:\n\n"
                 + (mix.round(2).to_string() if not mix.empty else "(none)"))
        print(text + "\n")
        lines += [text, ""]
    if not rows:
        raise SystemExit(f"error: {state.root}: no real runs (real-*.json) to report")
    shipped = json.loads(mode.profile.read_text())
    for backend, prof in remeasured.items():
        att = prof.get("attention", {})
        text = (f"re-measured profile, attention {backend} ({att.get('note', '')}; self-check "
                f"{att.get('self_check_rel_err')}), seconds over the shipped profile's at "
                f"common grid points:\n\n" + grid_ratios(shipped, prof).round(3).to_string())
        print(text + "\n")
        lines += [text, ""]
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.md").write_text("\n".join(lines) + "\n")
    pd.DataFrame(rows).to_csv(out / "fidelity.csv", index=False, float_format="%.6g")
    ok = [r["on_target"] for r in rows if r["on_target"] is not None]
    print(f"{sum(ok)}/{len(ok)} targeted (b) values on target; tables in {out}/fidelity.md")


ONCE = ("cold", "capacity", "calibrate")   # skipped when the state says they are done
RUN = {"serve": stage_serve, "cold": stage_cold, "capacity": stage_capacity,
       "calibrate": stage_calibrate,
       "workloads": stage_workloads, "heldout": stage_heldout, "stop": stage_stop,
       "profile": stage_profile, "report": stage_report}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", required=True,
                    help=f"comma-separated, in order: {', '.join(STAGES)}")
    ap.add_argument("--out", required=True, help="where this call's results go ($OUT)")
    ap.add_argument("--state", help="the campaign's state (default /tmp/fidelity-gpu/state, "
                                    "or /tmp/fidelity-rehearse/state with --rehearse)")
    ap.add_argument("--resume", type=Path, help="a folder of state-*.tgz from earlier calls")
    ap.add_argument("--rehearse", action="store_true",
                    help="vLLM's CPU build and the tiny model here (plumbing, not numbers)")
    ap.add_argument("--model", help="a model card (default Llama-3.1-8B; Qwen2.5-7B has a "
                                    "shipped H100 profile too)")
    ap.add_argument("--only", type=lambda s: s.split(","), help="workloads of this call")
    ap.add_argument("--repeats", type=int, help="real runs per workload (default 3)")
    ap.add_argument("--profile-limit", type=float, default=270.0,
                    help="seconds each profiler run of the profile stage may take")
    ap.add_argument("--profile-backends", type=lambda s: s.split(","),
                    help="attention backends the profile stage measures (default: vllm_fa,flex "
                         "on the GPU)")
    ap.add_argument("--profile-grid", choices=("quick", "full"),
                    help="the profile stage's grid (default quick; full: the shipped "
                         "profiles' grid, about 5 minutes for Llama-3.1-8B on an H100)")
    args = ap.parse_args(argv)
    stages = args.stages.split(",")
    bad = [s for s in stages if s not in STAGES]
    if bad:
        ap.error(f"--stages: unknown {bad}; expected some of {', '.join(STAGES)}")
    if args.repeats is not None and args.repeats < 1:
        ap.error(f"--repeats: must be >= 1, got {args.repeats}")
    mode = rehearse_mode() if args.rehearse else gpu_mode()
    if args.model:
        from simserve.cards import list_models
        if args.model not in list_models():
            ap.error(f"--model: no card {args.model!r}; expected one of {list_models()}")
        profile = ROOT / f"simserve/data/profiles/{args.model}_{mode.hardware}_bf16.json"
        mode = dataclasses.replace(mode, card=args.model, profile=profile)
    if not mode.profile.exists():
        ap.error(f"{mode.profile}: no shipped profile for {mode.card} on {mode.hardware}")
    default_state = "/tmp/fidelity-rehearse/state" if args.rehearse else \
        "/tmp/fidelity-gpu/state"
    state = State(Path(args.state or default_state).resolve())
    if args.resume:
        if not args.resume.is_dir():
            ap.error(f"--resume: {args.resume} is not a folder")
        print(f"resumed from {state.resume(args.resume)}", file=sys.stderr)
        cache = args.resume / "compile-cache.tgz"
        serving = {"serve", "cold", "capacity", "calibrate", "workloads", "heldout"} & set(stages)
        if serving and cache.exists() and not cache_root(state).exists():
            with tarfile.open(cache) as tar:
                tar.extractall(cache_root(state).parent, filter="data")
            print(f"vLLM compile cache restored into {cache_root(state)}", file=sys.stderr)
    out = Path(args.out)
    fc.raise_client_priority()
    for stage in stages:
        t0 = time.time()
        if stage in ONCE and state.done(stage):
            print(f"{stage}: done already (state)", file=sys.stderr)
            continue
        print(f"== {stage} ({mode.name}, {mode.card}) ==", file=sys.stderr)
        ok = False
        try:
            RUN[stage](mode, state, args)
            ok = True
            if stage in ONCE:
                state.mark(stage)
        finally:
            if stage not in ("report", "workloads", "heldout"):   # those pack per workload
                state.pack(stage if ok else f"{stage}-failed", out, t0)
        print(f"== {stage}: {time.time() - t0:.0f} s ==", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
