"""Pieces every fidelity campaign against a live vLLM server shares: the server process, the
scenario of a workload under the server's knobs, replaying it several times, simulating it,
and the error table. Used by ``fidelity_vllm.py`` (vLLM's CPU build, the tiny model) and
``fidelity_gpu.py`` (vLLM on a lent H100).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from simserve.live.calibrate import kv_tokens_from_log, run_calibrated  # noqa: E402
from simserve.config import parse_scenario  # noqa: E402
from simserve.live.fidelity import HEADLINE, error_table  # noqa: E402
from simserve.live.replay import replay  # noqa: E402
from simserve.runner import run  # noqa: E402

TARGETS = {"TPOT": 0.05, "E2EL": 0.05, "output": 0.05, "TTFT": 0.10}


# --------------------------------------------------------------------------------------------
# The server


def health(port: int, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


class Server:
    """vLLM's OpenAI server on 127.0.0.1, in its own process group (a new session); stopped by
    its PID. ``keep=True`` leaves it running when the block ends (the device machine keeps a
    process that started a new session alive between calls); :meth:`stop_pidfile` stops such a
    one later by the PID it wrote."""

    def __init__(self, cmd: list[str], env: dict, port: int, log_path: Path,
                 health_timeout: float = 400.0, keep: bool = False):
        self.cmd, self.env, self.port, self.log_path = cmd, env, port, log_path
        self.health_timeout, self.keep = health_timeout, keep
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None

    @property
    def pidfile(self) -> Path:
        return self.log_path.with_suffix(".pid")

    def __enter__(self) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, start_new_session=True,
                                     preexec_fn=_default_priority)
        self.pid = self.proc.pid
        self.pidfile.write_text(f"{self.pid}\n")
        print(f"started vLLM (pid {self.pid}): {' '.join(self.cmd)}", file=sys.stderr)
        t0 = time.time()
        while time.time() < t0 + self.health_timeout:
            if self.proc.poll() is not None:
                tail = "".join(self.log_path.read_text(errors="replace").splitlines(True)[-15:])
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}); see "
                                   f"{self.log_path}:\n{tail}")
            if health(self.port):
                self.start_s = time.time() - t0
                print(f"vLLM healthy after {self.start_s:.0f} s", file=sys.stderr)
                return self
            time.sleep(2)
        self.stop()
        raise RuntimeError(f"vLLM did not become healthy in {self.health_timeout:.0f} s; see "
                           f"{self.log_path}")

    def __exit__(self, *exc) -> None:
        if not self.keep or exc[0] is not None:
            self.stop()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kv_tokens(self) -> int | None:
        return kv_tokens_from_log(self.log_text())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _stop_group(self.proc.pid, self.proc.wait)
        self.pidfile.unlink(missing_ok=True)

    @staticmethod
    def stop_pidfile(pidfile: Path) -> None:
        """Stop a server a previous process started with ``keep=True`` (by its PID)."""
        if not pidfile.exists():
            return
        pid = int(pidfile.read_text().split()[0])

        def wait(timeout):
            deadline = time.time() + timeout
            while time.time() < deadline:
                try:   # our own child (started by this process): reap it, or it lingers a zombie
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                try:
                    os.killpg(pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.5)
            raise subprocess.TimeoutExpired(str(pid), timeout)
        try:
            _stop_group(pid, wait)
        except ProcessLookupError:
            pass
        pidfile.unlink(missing_ok=True)


def _stop_group(pid: int, wait) -> None:
    os.killpg(pid, signal.SIGTERM)            # our own group: the server and its workers
    try:
        wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(pid, signal.SIGKILL)
        try:
            wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    print(f"stopped vLLM (pid {pid})", file=sys.stderr)


def _default_priority() -> None:
    """In the server's process: back to the default priority (the client runs above it)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass


def raise_client_priority() -> int:
    """The measuring client (this process: a few % of one core) runs at nice -10 where it may,
    so a busy shared machine delays its sends and chunk reads less; the server keeps the
    default priority. Returns the niceness in force."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass
    return os.getpriority(os.PRIO_PROCESS, 0)


# --------------------------------------------------------------------------------------------
# Scenarios, replays, simulations


def scenario(name: str, workload: dict, knobs: dict, latency: dict, kv_blocks: int | None,
             base_dir: Path, *, model: str = "tiny-llama-45m", hardware: str = "cpu-epyc-2core",
             block_size: int = 32, max_model_len: int = 2048):
    """A vllm_v1 scenario of ``workload`` under the server's knobs and KV capacity."""
    engine = {**knobs, "block_size": block_size, "max_model_len": max_model_len,
              "enable_chunked_prefill": True}
    if kv_blocks:
        engine["num_gpu_blocks"] = kv_blocks
    raw = {"name": name, "seed": 0, "model": model, "hardware": hardware,
           "engine": engine, "scheduler": {"policy": "vllm_v1"}, "latency": latency,
           "workload": workload}
    return parse_scenario(raw, base_dir=base_dir, name=name)


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def wait_for_quiet(limit: float = 3.0, max_wait_s: float = 30.0) -> float:
    """Wait (bounded) for the 1-minute load average to drop below ``limit``; return it."""
    deadline = time.time() + max_wait_s
    while loadavg() >= limit and time.time() < deadline:
        time.sleep(5)
    return loadavg()


def measure(name: str, sc, endpoint: str, repeats: int, out: Path,
            calibrated: dict | None = None, time_limit: float = 600.0,
            quiet_limit: float = 3.0) -> list[dict]:
    """Replay ``sc`` ``repeats`` times into ``out/real/<name>/run<k>``; with ``calibrated``, a
    speed check (seconds of decode batches) right before each run reads how much slower than
    at calibration the server runs then."""
    from simserve.live.calibrate import speed_check
    summaries = []
    for k in range(repeats):
        before = wait_for_quiet(quiet_limit)
        speed = speed_check(sc, endpoint, calibrated)["factor"] if calibrated else None
        res = replay(sc, endpoint, timeout=120, time_limit=time_limit, warmup=2)
        res.save(out / "real" / name / f"run{k}")
        sm = res.summary
        print(f"  {name} run {k}: {sm['completed']}/{sm['num_requests']} finished, "
              f"TTFT p50 {sm['median_ttft_ms']:.1f} ms, TPOT p50 {sm['median_tpot_ms']:.2f} ms, "
              f"{sm['output_throughput']:.0f} tok/s (load {before} -> {loadavg()}; send lag "
              f"p99 {sm['send_lag_p99_ms']:.0f} ms"
              + (f"; speed check {speed:.3f}" if speed else "") + ")", file=sys.stderr)
        summaries.append({**sm, "load_before": before, "speed_factor": speed})
    return summaries


def simulate(name: str, sc, out: Path, calibrated: bool, folder: str | None = None) -> dict:
    res = run_calibrated(sc) if calibrated else run(sc)
    res.save(out / (folder or ("sim_calibrated" if calibrated else "sim_profile")) / name)
    return res.summary


# --------------------------------------------------------------------------------------------
# The error table


def _on_target(metric: str, row) -> bool | None:
    limit = next((v for k, v in TARGETS.items() if metric.startswith(k)), None)
    if limit is None:
        return None
    return bool(abs(row["rel. error"]) <= limit or (metric.startswith("TTFT") and row["in spread"]))


def report(name: str, reals: list[dict], sim_a: dict, sim_b: dict,
           sim_c: dict | None = None) -> tuple[str, list[dict]]:
    """A markdown table per metric: real median, real min-max, (a) the profile alone, (b) the
    calibrated profile, (c) optionally the speed-checked one, with relative errors; and the
    same as rows."""
    ta, tb = error_table(reals, sim_a, HEADLINE), error_table(reals, sim_b, HEADLINE)
    tc = error_table(reals, sim_c, HEADLINE) if sim_c is not None else None
    lag = [r.get("send_lag_p99_ms") or 0.0 for r in reals]
    speeds = [r["speed_factor"] for r in reals if r.get("speed_factor")]
    loads = [r["load_before"] for r in reals if r.get("load_before") is not None]
    lines = [f"### {name}  ("
             + (f"load average {min(loads):.1f}-{max(loads):.1f}; " if loads else "")
             + f"{len(reals)} real runs; client send lag p99 {min(lag):.0f}-{max(lag):.0f} ms"
             + (f"; speed checks {', '.join(f'{s:.3f}' for s in speeds)}" if speeds else "")
             + ")", "",
             "| metric | real (median) | real min-max | sim (a) profile | err (a) "
             "| sim (b) calibrated | err (b) | (b) on target |"
             + (" sim (c) speed-checked | err (c) | (c) on target |" if tc is not None else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if tc is not None else "")]
    rows = []
    yes = {None: "—", True: "yes", False: "no"}
    for metric in ta.index:
        a, b = ta.loc[metric], tb.loc[metric]
        ok = _on_target(metric, b)
        line = (f"| {metric} | {a['real']:.4g} | {a['real min']:.4g}-{a['real max']:.4g} "
                f"| {a['sim']:.4g} | {100 * a['rel. error']:+.1f} % | {b['sim']:.4g} "
                f"| {100 * b['rel. error']:+.1f} % | {yes[ok]} |")
        row = {"workload": name, "metric": metric, "real": a["real"],
               "real_min": a["real min"], "real_max": a["real max"],
               "sim_profile": a["sim"], "err_profile": a["rel. error"],
               "sim_calibrated": b["sim"], "err_calibrated": b["rel. error"],
               "in_spread_calibrated": bool(b["in spread"]), "on_target": ok}
        if tc is not None:
            c = tc.loc[metric]
            ok_c = _on_target(metric, c)
            line += f" {c['sim']:.4g} | {100 * c['rel. error']:+.1f} % | {yes[ok_c]} |"
            row.update({"sim_speed_checked": c["sim"], "err_speed_checked": c["rel. error"],
                        "on_target_speed_checked": ok_c})
        lines.append(line)
        rows.append(row)
    return "\n".join(lines), rows


def plain(v):
    """A JSON ``default=`` for numpy scalars."""
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return str(v)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"
