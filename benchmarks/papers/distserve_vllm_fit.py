"""The CPU cost per step and per sequence of the engines DistServe compared, fitted to the
per-request measurements its artifact ships.

DistServe's artifact (LLMServe/DistServe ``simdistserve/benchmarks/alignment/data-ground-truth/
opt-13b-sharegpt/``) holds, for OPT-13B on A100-80GB and its chatbot requests, the runs of the
vLLM it compared against (v0.2.3, eager, ``--engine-use-ray``; ``vllm-<N>-<rate>.exp``, 1 to 4
req/s) and of its own 2P1D server (a TP-2 prefill instance and a 1-GPU decode instance;
``distserve-c21d11-<N>-<rate>.exp``): per request the prompt and output lengths and the issue,
first-token and completion times. They are read from a checkout you give, never shipped::

    python benchmarks/papers/distserve_vllm_fit.py --data PATH/TO/opt-13b-sharegpt

Every run's requests are replayed at their measured issue times through ``distserve.yaml``'s
``colocated`` (vLLM) or ``2P1D`` variant. Measured decode steps are slower than the roofline's,
the more so the more sequences a step carries (vLLM's median TPOT 2.2x the roofline's at 3
req/s): the engines' Python work per step (the scheduler, the Ray round trip) and per sequence
in a step (its inputs, sampling bookkeeping, incremental detokenisation, its output shipped to
the API server). So each step gets ``a + c × (sequences sampled)``: ``latency.step_overhead_ms``
grows by ``a`` and ``latency.per_output_token_ms = c`` (on the decode group for 2P1D), found by
least squares on the runs of ``--fit`` (vLLM) and ``--fit-distserve`` only::

    TPOT_i × (out_i − 1) − (D_i − a·|W_i| − c·S_i)  =  a·|W_i| + c·S_i

over requests i with more than one output token, where, in a simulation at the current (a, c),
W_i is the steps of the replica making i's later tokens that end between its first token and
its last, S_i the sequences those steps sample (decodes and completed prompts), D_i the
simulated time from i's first token to its last (the steps, and for 2P1D the KV transfer and the
wait to join a step). At the costs a run was made with, that is exact (the unit test recovers
them from runs simserve made). The fit is repeated, each time halfway to the new solution, until
(a, c) move by less than 10 µs (at most 30 times). The front-end delay
(``latency.frontend_delay_ms``) is then the median of the measured minus the simulated TTFT over
the fitted runs (for 2P1D on every replica). The other runs are held out: for every run the
script prints the measured percentiles and attainment against simserve's roofline alone (its
2 ms step overhead, no per-sequence cost, no front-end delay) and with the fitted costs.
"""

from __future__ import annotations

import argparse
import ast
import copy
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import HERE, variants

import simserve
from simserve.config import parse_scenario
from simserve.latency.roofline import DEFAULT_STEP_OVERHEAD_S

FIELDS = ("prompt_len", "output_len", "issue_time", "first_token_time", "complete_time",
          "ttft_ms", "tpot_ms")
SLO_TTFT_MS, SLO_TPOT_MS = 250.0, 100.0          # DistServe's chatbot SLO for OPT-13B
TOL_MS = 0.01          # the fit stops when (a, c) move by less than 10 µs
NAMES = {"colocated": re.compile(r"^vllm-(\d+)-([0-9.]+)\.exp$"),
         "2P1D": re.compile(r"^distserve-c21d11-(\d+)-([0-9.]+)\.exp$")}


class InputError(Exception):
    """A bad input file or argument: one line, exit code 2."""


def read_run(path: Path) -> dict[str, np.ndarray]:
    """A measured run: the list of per-request dicts on the file's first line."""
    try:
        first = path.read_text(encoding="utf-8").split("\n", 1)[0]
        rows = ast.literal_eval(first)
    except (OSError, UnicodeDecodeError, ValueError, SyntaxError) as e:
        raise InputError(f"{path}:1: not a DistServe run (a Python list of dicts on its first "
                         f"line): {type(e).__name__}") from None
    if not isinstance(rows, list) or not rows:
        raise InputError(f"{path}:1: expected a non-empty list of per-request dicts")
    for k, row in enumerate(rows):
        missing = [f for f in FIELDS if not isinstance(row, dict) or f not in row]
        if missing:
            raise InputError(f"{path}:1: request {k} lacks {', '.join(missing)}")
    cols = {f: np.array([float(r[f]) for r in rows]) for f in FIELDS}
    if not np.all(np.isfinite(np.concatenate(list(cols.values())))):
        raise InputError(f"{path}:1: a value is not a finite number")
    if np.any(cols["prompt_len"] < 1) or np.any(cols["output_len"] < 1):
        raise InputError(f"{path}:1: a prompt or output length is below 1")
    order = np.argsort(cols["issue_time"], kind="stable")
    return {f: v[order] for f, v in cols.items()}


class Replay:
    """A measured run replayed through one of distserve.yaml's variants: ``colocated`` (the
    costs on its latency) or ``2P1D`` (the costs on its decode group's latency)."""

    def __init__(self, run: dict[str, np.ndarray], tmp: Path, tag: str, label: str):
        self.run, self.label = run, label
        self.trace = tmp / f"{tag}.csv"
        t = run["issue_time"] - run["issue_time"][0]
        lines = ["arrival_s,prompt_tokens,output_tokens"] + [
            f"{float(a)!r},{int(p)},{int(o)}" for a, p, o in zip(t, run["prompt_len"],
                                                                run["output_len"])]
        self.trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
        raw = copy.deepcopy(variants("distserve")[label].source)
        raw["workload"] = {"trace": str(self.trace), "format": "csv"}
        self.raw = raw
        groups = raw.get("cluster", {}).get("groups", [])
        first = 0
        self.token_replicas: set[int] | None = None     # who makes tokens after the first
        for g in groups:
            if g["role"] == "decode":
                self.token_replicas = set(range(first, first + g["replicas"]))
            first += g["replicas"]

    def simulate(self, costs: dict[str, float]):
        """The replay with ``costs`` (latency fields): the front-end delay on every replica,
        the CPU costs on the replicas that make the later tokens."""
        raw = copy.deepcopy(self.raw)
        top = raw.setdefault("latency", {})
        groups = raw.get("cluster", {}).get("groups", [])
        target = next((g.setdefault("latency", {}) for g in groups if g["role"] == "decode"),
                      top)
        for key, value in costs.items():
            (top if key == "frontend_delay_ms" else target)[key] = value
        s = parse_scenario(raw, base_dir=HERE, name="distserve")
        r = simserve.run(s, keep_steps=True)
        return r.requests.sort_values("request_id"), r.steps

    def rows(self, costs: dict[str, float], a_s: float, c_s: float):
        """The regression's rows for this run (requests with more than one output token)."""
        q, st = self.simulate(costs)
        if self.token_replicas is not None:
            st = st[st["replica"].isin(self.token_replicas)]
        start, dur = st["start_s"].to_numpy(), st["duration_s"].to_numpy()
        end = start + dur
        # every prefill sequence samples: vllm_v0 (and DistServe's prefill) run whole prompts
        sampled = (st["num_decode_seqs"] + st["num_prefill_seqs"]).to_numpy()
        first, finish = q["first_token_s"].to_numpy(), q["finish_s"].to_numpy()
        ys, xs = [], []
        for i, out in enumerate(self.run["output_len"]):
            if out < 2:
                continue
            w = (end > first[i] + 1e-9) & (end <= finish[i] + 1e-9)
            x = (float(w.sum()), float(sampled[w].sum()))
            # the simulated time from the first token to the last without (a, c): the steps'
            # own times, and (disaggregated) the KV transfer and the wait to join a step
            base = (finish[i] - first[i]) - (a_s * x[0] + c_s * x[1])
            ys.append(self.run["tpot_ms"][i] / 1e3 * (out - 1) - base)
            xs.append(x)
        return ys, xs

def costs(step0_ms: float, a_ms: float, c_ms: float, f_ms: float | None = None) -> dict:
    """Latency fields of a fit: ``a`` on top of the roofline's step overhead ``step0_ms``."""
    out = {"step_overhead_ms": step0_ms + a_ms, "per_output_token_ms": c_ms}
    return out | ({"frontend_delay_ms": f_ms} if f_ms is not None else {})


def fit_cpu_costs(replays: dict[float, Replay], fit_rates: set[float], step0_ms: float,
                  front_end: bool = True, log=print) -> tuple[float, float, float | None]:
    """(a, c, f) in ms fitted on the runs at ``fit_rates`` (module docstring); f None
    without ``front_end``."""
    a, c = 0.0, 0.0
    for it in range(30):
        ys, xs = [], []
        for rate in sorted(fit_rates):
            y, x = replays[rate].rows(costs(step0_ms, a, c), a / 1e3, c / 1e3)
            ys += y
            xs += x
        sol = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)[0] * 1e3
        if it:          # halfway to the new solution: the step composition moves with (a, c)
            sol = (sol + (a, c)) / 2
        if min(sol) < 0:    # a CPU cost cannot be negative (nor can the scenario's field be)
            log(f"  fit {it + 1}: least squares gave {sol[0]:.3f} ms, {sol[1]:.3f} ms; the "
                f"negative one held at 0")
            sol = np.maximum(sol, 0.0)
        moved = max(abs(sol[0] - a), abs(sol[1] - c))
        a, c = float(sol[0]), float(sol[1])
        log(f"  fit {it + 1}: per step +{a:.3f} ms, per sampled sequence {c:.3f} ms "
            f"({len(ys)} requests)")
        if moved < TOL_MS:
            break
    else:
        log(f"  not converged in 30 rounds (last move {moved:.3f} ms): the last values used")
    if not front_end:
        return a, c, None
    gaps = []
    for rate in sorted(fit_rates):
        q, _ = replays[rate].simulate(costs(step0_ms, a, c, 0.0))
        gaps.append(replays[rate].run["ttft_ms"] - 1e3 * q["ttft_s"].to_numpy())
    # a delay cannot be negative: a simulated TTFT already longer than the measured one is
    # the prefill's cost, not the front end's (kept at 0)
    return a, c, max(0.0, float(np.median(np.concatenate(gaps))))

def percentiles(ttft_ms: np.ndarray, tpot_ms: np.ndarray, out: np.ndarray) -> tuple:
    m = out > 1
    ok = (ttft_ms <= SLO_TTFT_MS) & ((tpot_ms <= SLO_TPOT_MS) | ~m)
    return (np.percentile(tpot_ms[m], 50), np.percentile(tpot_ms[m], 90),
            np.percentile(ttft_ms, 50), np.percentile(ttft_ms, 90), ok.mean())


def runs_in(data: Path, label: str) -> list[tuple[float, Path]]:
    return sorted(((float(m.group(2)), p) for p in data.iterdir()
                   if (m := NAMES[label].search(p.name))), key=lambda rp: rp[0])


def rates(text: str, flag: str) -> set[float]:
    try:
        return {float(x) for x in text.split(",")}
    except ValueError:
        raise InputError(f"{flag}: expected comma-separated rates, got {text!r}") from None


def report(label: str, runs: list[tuple[float, Path]], fit_rates: set[float], tmp: Path,
           front_end: bool) -> None:
    missing = fit_rates - {r for r, _ in runs}
    if missing:
        raise InputError(f"no {label} run at rate {', '.join(f'{r:g}' for r in sorted(missing))}")
    step0_ms = DEFAULT_STEP_OVERHEAD_S["gpu"] * 1e3     # the roofline's own step overhead
    replays = {rate: Replay(read_run(p), tmp, f"{label}-{k}", label)
               for k, (rate, p) in enumerate(runs)}
    where = "latency" if label == "colocated" else "the decode group's latency"
    print(f"{label}: fitting {where} on {', '.join(f'{r:g}' for r in sorted(fit_rates))} req/s",
          flush=True)
    a, c, f = fit_cpu_costs(replays, fit_rates, step0_ms, front_end,
                            log=lambda m: print(m, flush=True))
    print(f"{label}: step_overhead_ms {step0_ms + a:.2f} (+{a:.2f}), per_output_token_ms "
          f"{c:.3f}" + (f", frontend_delay_ms {f:.1f}" if f is not None else "") + "\n")
    head = ("run", "", "TPOT p50", "TPOT p90", "TTFT p50", "TTFT p90", "attained")
    print("{:<16}{:<10}{:>10}{:>10}{:>10}{:>10}{:>10}".format(*head))
    for rate, rp in replays.items():
        run = rp.run
        tag = f"{rate:g} req/s" + (" (fit)" if rate in fit_rates else "")
        rows = [("measured", percentiles(run["ttft_ms"], run["tpot_ms"], run["output_len"]))]
        for name, extra in (("roofline", costs(step0_ms, 0.0, 0.0, 0.0 if front_end else None)),
                            ("fitted", costs(step0_ms, a, c, f))):
            q, _ = rp.simulate(extra)
            rows.append((name, percentiles(1e3 * q["ttft_s"].to_numpy(),
                                           1e3 * q["tpot_s"].to_numpy(), run["output_len"])))
        for k, (name, v) in enumerate(rows):
            print(f"{tag if k == 0 else '':<16}{name:<10}" + "".join(
                f"{x:>10.1f}" for x in v[:4]) + f"{v[4]:>10.2f}")
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="the artifact's opt-13b-sharegpt folder "
                                                  "(its vllm-*.exp and distserve-c21d11-*.exp)")
    ap.add_argument("--fit", default="1,1.5", help="rates of the vLLM runs to fit on "
                                                    "(default 1,1.5); the rest are held out")
    ap.add_argument("--fit-distserve", default="3", help="rates of DistServe's 2P1D runs to "
                                                         "fit on (default 3)")
    args = ap.parse_args(argv)
    data = Path(args.data)
    if not data.is_dir():
        raise InputError(f"--data: {data} is not a folder")
    found = {label: runs_in(data, label) for label in NAMES}
    if not any(found.values()):
        raise InputError(f"--data: no vllm-<N>-<rate>.exp or distserve-c21d11-<N>-<rate>.exp "
                         f"files in {data}")
    fits = {"colocated": rates(args.fit, "--fit"),
            "2P1D": rates(args.fit_distserve, "--fit-distserve")}
    with tempfile.TemporaryDirectory() as tmpdir:
        for label, runs in found.items():
            if runs:
                report(label, runs, fits[label], Path(tmpdir), front_end=True)
    return 0

if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
