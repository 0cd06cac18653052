"""Black-box calibration of a measured kernel profile against a live server.

A kernel profile prices the device work of a step; a real engine adds what the profiler cannot
see. ``simserve calibrate scenario.yaml --endpoint URL --out calibrated.json`` sends probe
requests, predicts each probe's timings from the profile under the scenario's engine knobs, and
fits by least squares (relative errors, non-negative coefficients)::

    step(plan)  = step_overhead_s                        engine/CPU work of every step
                + per_output_token_s · num_sampled       per sampled token: sampling bookkeeping,
                                                         output processing, detokenising, SSE
                + scale · GEMM kernels(plan)             the profile's measured parts: embedding,
                                                         linear layers, LM head
                + prefill_attention_scale · prefill attention(plan)
                + decode_attention_scale · decode attention(plan)
                                                         (a serving engine's attention kernels
                                                         differ most from the profiler's, and
                                                         its prefill and decode kernels differ
                                                         from each other)
                + admission_s · requests admitted(plan)  the engine's work to take a request in
                                                         (prefill chunks at context 0)
    TTFT        = frontend_delay_s + Σ steps up to the first token

``frontend_delay_s`` is the HTTP server's hand-off to the engine and the stream back: a fixed
per-request latency outside the steps. In a single request's TTFT it and ``admission_s`` both
count once; the mixed probes, whose step admits a request but holds no front end, tell them
apart.

Probes (bounded: a few hundred requests, all sent to one loopback endpoint by default):

* **single** requests, one at a time on an idle server, over prompt lengths: TTFT (the prefill
  steps, chunked by ``max_num_batched_tokens``) and TPOT (decode steps of one sequence);
* **decode batches**: c requests sent together, for several concurrencies c, at a short and a
  long prompt (so that the fit sees decode attention over long contexts); the steady decode
  step time is measured where all c are decoding (after the last first token, before the first
  finish), per request as (last - first chunk time) / tokens between, then the median;
* **mixed steps**: a newcomer's prompt sent into a running decode stream; the stream's gap that
  ends with the newcomer's first token is the step that admitted it beside one decode;
* **a load**: an open-loop Poisson load (``ProbePlan.load_*``), whose decode and mixed steps
  are read off the token streams (``load_steps``): steps as a loaded server runs them, beside
  other requests' arrivals and streaming output, which closed probes run faster.

``speed_check`` re-measures, in seconds, how much slower than at calibration a server runs now;
``rescaled`` applies that factor to a calibrated profile.

The calibrated profile is the base profile plus a ``calibration`` block (read by
``simserve.latency.profile.ProfileLatency``), with provenance: endpoint, engine version (from
``/version`` when the server has it), date, probes, load average, the fit and its residuals. The
server's KV capacity (vLLM logs ``KV cache size: N tokens``) can be recorded too, so simulated
memory matches: ``num_gpu_blocks = N // block_size``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simserve.errors import ConfigError, DataError, SimserveError
from simserve.live.client import check_client_options, check_endpoint_host, load_average
from simserve.live.fit import (PARAMS, Observation, decode_plan, fit, mixed_plan,
                               observations_from_probes, single_prefill_plans, step_features,
                               steady_plans)
from simserve.live.probes import (LoadSteps, ProbePlan, load_steps, mixed_step, probe_server,
                                  steady_decode_step)
from simserve.paths import check_out_dir

if TYPE_CHECKING:   # the CLI builds its parser from this module: keep importing it cheap
    from simserve.config import Scenario

# the names a calibration user needs, wherever they live (probes: what is sent and read back;
# fit: the model and the solve)
__all__ = ["calibrate", "speed_check", "rescaled", "run_calibrated", "write_calibrated",
           "format_calibration", "kv_tokens_from_log", "register", "CALIBRATION_VERSION",
           "PARAMS", "SPEED_PLAN", "ProbePlan", "Observation", "LoadSteps", "fit", "load_steps",
           "mixed_step", "steady_decode_step", "single_prefill_plans", "mixed_plan",
           "decode_plan", "step_features", "steady_plans", "observations_from_probes"]

CALIBRATION_VERSION = 1


def kv_tokens_from_log(text: str) -> int | None:
    """The KV capacity vLLM logs at start-up (``KV cache size: 262,144 tokens``), or None."""
    m = re.findall(r"KV cache size:\s*([\d,_]+)\s*tokens", text)
    return int(m[-1].replace(",", "").replace("_", "")) if m else None


def calibrate(scenario: Scenario | str | Path, endpoint: str, *, base_profile: str | Path |
              None = None, model: str | None = None, plan: ProbePlan = ProbePlan(),
              num_gpu_blocks: int | None = None, kv_tokens: int | None = None,
              timeout: float = 120.0, warmup: int = 2, allow_remote: bool = False,
              fixed: dict[str, float] | None = None, overrides: list[str] | None = None,
              log=None) -> dict:
    """Probe ``endpoint``, fit, and return the calibrated profile (base profile + a
    ``calibration`` block). The base profile is ``base_profile`` or the scenario's
    ``latency.path`` (``latency.model: profile``)."""
    from simserve.config import Scenario, load_scenario
    from simserve.latency.profile import ProfileLatency
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    endpoint = check_endpoint_host(endpoint, allow_remote)
    check_client_options(timeout, warmup)
    path = _profile_path(base_profile, Path("."), "--profile") if base_profile \
        else _scenario_profile(s)
    base = ProfileLatency.from_file(path, s.model)
    base_dict = {k: v for k, v in base.profile.items() if k != "calibration"}
    kernels = ProfileLatency(base_dict, source=str(path))   # kernels only: no overhead, scale 1
    blocks = _kv_blocks(s, num_gpu_blocks, kv_tokens)
    plan = plan.for_scenario(s)
    if not plan.prompt_lens or not plan.concurrencies:
        raise ConfigError("engine", "no probe fits this scenario's max_model_len/max_num_seqs")
    started = _dt.datetime.now(_dt.timezone.utc)
    load_before = load_average()
    t0 = time.perf_counter()
    info, records = asyncio.run(probe_server(s, endpoint, model, plan, timeout, warmup, log))
    wall = time.perf_counter() - t0
    budget = s.max_num_batched_tokens
    obs = observations_from_probes(records, kernels, budget)
    result = fit(obs, fixed)
    calibration = {
        "version": CALIBRATION_VERSION,
        **result.params,
        "num_gpu_blocks": blocks,
        "kv_tokens": kv_tokens if kv_tokens is not None else (
            blocks * s.engine.block_size if blocks else None),
        "block_size": s.engine.block_size,
        "fit": {"method": "least squares on relative errors, non-negative",
                "fixed": dict(fixed or {}), "num_observations": len(obs),
                "residual_rel_rms": result.rel_rms, "residual_rel_max": result.rel_max,
                "residuals": result.residuals},
        "provenance": {
            "endpoint": endpoint, "model": info["model"], "engine_version": info["engine_version"],
            "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "base_profile": str(path),
            "scenario": s.name,
            "engine_knobs": {"max_num_seqs": s.engine.max_num_seqs,
                             "max_num_batched_tokens": budget,
                             "block_size": s.engine.block_size,
                             "max_model_len": s.max_model_len},
            "probes": {**dataclasses.asdict(plan), "num_requests": plan.num_requests,
                       "warmup": warmup, "wall_s": wall},
            "load_average_before": load_before, "load_average_after": load_average(),
        },
    }
    return {**base_dict, "calibration": calibration}


# --------------------------------------------------------------------------------------------
# Re-measuring the server's speed since calibration


TIME_TERMS = ("step_overhead_s", "per_output_token_s", "scale", "attention_scale",
              "prefill_attention_scale", "decode_attention_scale", "frontend_delay_s",
              "admission_s")      # every calibrated term that is a time, or scales one
SPEED_PLAN = ProbePlan(prompt_lens=(), mixed_prompts=(), concurrencies=(1, 4, 16),
                       long_batch_prompts=(), batch_output=48, repeats=1, load_requests=0)


def speed_check(scenario: Scenario | str | Path, endpoint: str, calibrated: dict, *,
                plan: ProbePlan = SPEED_PLAN, timeout: float = 60.0, warmup: int = 1,
                allow_remote: bool = False) -> dict:
    """How fast the server runs now against a calibrated profile of it: a few decode batches
    (seconds, not minutes), each one's steady step measured over the step the calibrated
    model predicts. Returns ``{"factor": median ratio, "ratios": {probe: ratio}}``; a factor
    of 1.1 means steps take 10 % longer than at calibration (a shared machine's speed drifts
    by that much within minutes). ``rescaled(calibrated, factor)`` is the profile at that
    speed."""
    from simserve.config import Scenario, load_scenario
    from simserve.latency.profile import ProfileLatency
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    endpoint = check_endpoint_host(endpoint, allow_remote)
    check_client_options(timeout, warmup)
    plan = plan.for_scenario(s)
    if not plan.concurrencies:
        raise ConfigError("engine", "no speed probe fits this scenario's max_num_seqs")
    model = ProfileLatency(calibrated, source="<calibrated profile>")
    _, records = asyncio.run(probe_server(s, endpoint, None, plan, timeout, warmup, None))
    ratios = {}
    for r in records:
        steady = steady_decode_step(r["times"], r["counts"], r["prompt"])
        if steady is None:
            continue
        step, lo, hi = steady
        predicted = np.mean([model.step_time(p)
                             for p in steady_plans(r["c"], max(lo, r["prompt"]), hi)])
        ratios[f"batch c={r['c']} P={r['prompt']} step"] = float(step / predicted)
    if not ratios:
        raise SimserveError(f"{endpoint}: the speed check measured no steady decode step")
    return {"factor": float(np.median(list(ratios.values()))), "ratios": ratios}


def rescaled(calibrated: dict, factor: float) -> dict:
    """The calibrated profile with every calibrated time (and every scale on the kernel
    times) multiplied by ``factor``: the same server, uniformly ``factor`` times slower."""
    cal = dict(calibrated["calibration"])
    for key in TIME_TERMS:
        if key in cal:
            cal[key] = cal[key] * factor
    if "scale" not in cal:                 # (its default: 1)
        cal["scale"] = factor
    cal["speed_factor"] = factor
    return {**calibrated, "calibration": cal}


def _scenario_profile(s: Scenario) -> Path:
    if s.latency.model != "profile" or not s.latency.path:
        raise ConfigError("latency.path", "calibration needs a base profile: set latency.model: "
                                          "profile and latency.path, or pass --profile")
    return _profile_path(s.latency.path, s.base_dir, "latency.path")


def _profile_path(given: str | Path, base_dir: Path, where: str) -> Path:
    """A profile as ``simserve run`` finds it (a file relative to ``base_dir``, else a shipped
    profile's bare name); ConfigError naming ``where`` when neither exists."""
    from simserve.latency.profile import find_profile
    return find_profile(given, base_dir, where)


def _kv_blocks(s: Scenario, num_gpu_blocks: int | None, kv_tokens: int | None) -> int | None:
    if num_gpu_blocks is not None and kv_tokens is not None:
        raise SimserveError("give either --num-gpu-blocks or --kv-tokens, not both")
    if num_gpu_blocks is not None:
        if num_gpu_blocks < 1:
            raise SimserveError(f"--num-gpu-blocks: must be >= 1, got {num_gpu_blocks}")
        return num_gpu_blocks
    if kv_tokens is not None:
        if kv_tokens < s.engine.block_size:
            raise SimserveError(f"--kv-tokens: must be >= block_size "
                                f"({s.engine.block_size}), got {kv_tokens}")
        return kv_tokens // s.engine.block_size
    return None


def write_calibrated(profile: dict, out: str | Path) -> Path:
    from simserve.latency.schema import validate
    out = Path(out)
    validate(profile, out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(profile, indent=1) + "\n")
    except OSError as e:
        raise SimserveError(f"{out}: cannot write ({e.strerror})") from None
    return out


# --------------------------------------------------------------------------------------------
# Simulating with a calibrated profile, front-end delay included


def run_calibrated(scenario: Scenario | str | Path, overrides: list[str] | None = None):
    """``runner.run`` with the summary's ``frontend_delay_ms`` always present (0 without a
    calibration). ``runner.collect`` applies a calibrated profile's front-end delay ``h``
    itself: each request reaches the engine ``h`` after the client sends it, so every engine
    time moves ``h`` later onto the client's clock: first token and finish (TTFT, E2EL) move by
    ``h``, TPOT and ITL do not, and the run lasts ``h`` longer."""
    from simserve.runner import run
    result = run(scenario, overrides=overrides)
    result.summary.setdefault("frontend_delay_ms", 0.0)
    return result


# --------------------------------------------------------------------------------------------
# Command line


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="fit per-step overheads and a kernel scale to a "
                                                "live server; write a calibrated profile")
    p.add_argument("scenario", help="scenario YAML: engine knobs of the server, the model, and "
                                    "(latency.path) the base profile")
    p.add_argument("--endpoint", required=True,
                   help="the server's root URL, e.g. http://127.0.0.1:8011 (an OpenAI base "
                        "URL ending in /v1 is read as its root)")
    p.add_argument("--out", required=True, help="calibrated profile (JSON) to write")
    p.add_argument("--profile", help="base profile (default: the scenario's latency.path)")
    p.add_argument("--model", help="model name to request (default: the first of /v1/models)")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--num-gpu-blocks", type=int, metavar="N", help="the server's KV blocks")
    kv.add_argument("--kv-tokens", type=int, metavar="N",
                    help="the server's KV capacity in tokens (vLLM: `KV cache size: N tokens`)")
    kv.add_argument("--server-log", metavar="PATH",
                    help="read the KV capacity from the server's start-up log")
    p.add_argument("--repeats", type=int, default=ProbePlan.repeats,
                   help=f"rounds of probes (default {ProbePlan.repeats})")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="per-request timeout in seconds (default 120)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="FIELD=VALUE", help="override a scenario field (repeatable)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback endpoint host")
    p.set_defaults(handler=_cmd_calibrate)


MAX_REPEATS = 100       # rounds of probes: each takes minutes on a slow server


def _cmd_calibrate(args) -> int:
    import sys
    kv_tokens = args.kv_tokens
    if args.server_log:
        try:
            text = Path(args.server_log).read_text(errors="replace")
        except OSError as e:
            raise DataError(args.server_log, f"cannot read ({e.strerror})") from None
        kv_tokens = kv_tokens_from_log(text)
        if kv_tokens is None:
            raise DataError(args.server_log, "no 'KV cache size: N tokens' line found")
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise SimserveError(f"--repeats: must be 1 to {MAX_REPEATS}, got {args.repeats}")
    out = Path(args.out)     # before the probes (minutes of a live server), not after them
    if out.is_dir():
        raise SimserveError(f"{out}: is a directory; --out names the profile file to write")
    check_out_dir(out.parent)
    plan = dataclasses.replace(ProbePlan(), repeats=args.repeats)
    profile = calibrate(args.scenario, args.endpoint, base_profile=args.profile,
                        model=args.model, plan=plan, num_gpu_blocks=args.num_gpu_blocks,
                        kv_tokens=kv_tokens, timeout=args.timeout,
                        allow_remote=args.allow_remote, overrides=args.overrides,
                        log=lambda line: print(line, file=sys.stderr))
    print(format_calibration(profile["calibration"]))
    out = write_calibrated(profile, out)
    cal = profile["calibration"]
    # (absolute: a scenario reads latency.path relative to its own folder)
    sets = f"--set latency.model=profile --set latency.path={Path(out).resolve()}"
    if cal["num_gpu_blocks"]:
        sets += f" --set engine.num_gpu_blocks={cal['num_gpu_blocks']}"
    print(f"calibrated profile: {out}\nsimulate with: simserve run SCENARIO {sets}")
    return 0


def format_calibration(cal: dict) -> str:
    f = cal["fit"]
    lines = [
        f"step overhead      {cal['step_overhead_s'] * 1e3:8.3f} ms",
        f"per output token   {cal['per_output_token_s'] * 1e3:8.3f} ms",
        f"GEMM kernel scale  {cal['scale']:8.3f}",
        *([f"attention scale    {cal['attention_scale']:8.3f}"] if "attention_scale" in cal
          else [f"prefill attention  {cal['prefill_attention_scale']:8.3f} (scale)",
                f"decode attention   {cal['decode_attention_scale']:8.3f} (scale)"]),
        f"front-end delay    {cal['frontend_delay_s'] * 1e3:8.3f} ms",
        f"per admission      {cal.get('admission_s', 0.0) * 1e3:8.3f} ms",
        f"fit: {f['num_observations']} observations, relative residual rms "
        f"{100 * f['residual_rel_rms']:.1f} %, max {100 * f['residual_rel_max']:.1f} %",
    ]
    for r in f["residuals"]:
        lines.append(f"  {r['probe']:<24} measured {r['measured_s'] * 1e3:8.2f} ms  fitted "
                     f"{r['fitted_s'] * 1e3:8.2f} ms  {100 * r['rel_error']:+6.1f} %")
    if cal.get("num_gpu_blocks"):
        lines.append(f"KV capacity        {cal['num_gpu_blocks']} blocks of {cal['block_size']} "
                     f"tokens")
    return "\n".join(lines)
