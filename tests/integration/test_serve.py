"""``simserve serve``: the scenario's engine on the wall clock (simserve/live/driver.py), and the
whole command driven by ``simserve replay`` over loopback HTTP.

The end-to-end check has two parts, so that a noisy machine cannot hide a wrong schedule:
the server's own schedule must equal ``simserve run`` of the arrivals it saw (exact, up to
float rounding), and what the client measured must follow it within the HTTP path's delay.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simserve.config import load_scenario

SCENARIO = """\
name: serve_small
seed: 3
model: Llama-3.1-8B
hardware: H100-SXM
engine: {max_num_seqs: 64, max_num_batched_tokens: 2048, block_size: 16, max_model_len: 4096}
scheduler: {policy: vllm_v1}
# (no front-end delay: the live server's own HTTP path is its front end, docs/serve.md)
latency: {model: roofline, frontend_delay_ms: 0}
workload:
  arrival: poisson
  rate: 25
  num_requests: 60
  prompt: {dist: lognormal, mean: 600, sigma: 0.6, max: 3000}
  output: {dist: uniform, low: 8, high: 60}
"""


def write_scenario(tmp_path: Path, text: str = SCENARIO, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the driver alone, in one event loop ---------------------------------------------------

def run_live(scenario, plan, **kw):
    """Submit ``plan`` = [(delay_s, prompt, output, replica)] in order; every stream's token
    count, arrival and last token time (simulated), and the stats at the end."""
    from simserve.live.driver import WallClockSimulation

    async def main():
        sim = WallClockSimulation(scenario, **kw)
        streams = []
        for delay, p, o, replica in plan:
            await asyncio.sleep(delay)
            streams.append(sim.submit(p, o, replica))

        async def drain(s):
            n = 0
            while k := await s.take():
                n += k
            return n

        counts = await asyncio.wait_for(asyncio.gather(*(drain(s) for s in streams)), 30)
        stats = sim.stats()
        sim.close()
        return sim, streams, counts, stats

    return asyncio.run(main())


def test_driver_streams_every_token_on_the_wall_clock(tmp_path):
    s = load_scenario(write_scenario(tmp_path))
    plan = [(0.0, 300, 20, None), (0.01, 500, 5, None), (0.02, 100, 12, None)]
    t0 = time.monotonic()
    sim, streams, counts, stats = run_live(s, plan, record=True)
    wall = time.monotonic() - t0
    assert counts == [20, 5, 12]
    assert all(st.done and not st.reject_reason for st in streams)
    assert streams[0].arrival_s == 0.0
    # never ahead of the wall clock: the last token cannot leave before its simulated time
    assert wall >= max(st.last_token_s for st in streams)
    assert [r.num_output_tokens for r in sorted(sim.served, key=lambda r: r.request_id)] \
        == [20, 5, 12]
    [st] = stats
    assert (st.num_running, st.num_waiting, st.kv_usage) == (0, 0, 0.0)
    assert st.generation_tokens == 37 and st.requests_finished == 3
    assert st.prompt_tokens == 900
    # the histograms hold every request's simulated TTFT and E2EL and every gap between tokens
    assert (st.ttft.count, st.e2el.count, st.itl.count) == (3, 3, 37 - 3)
    ttft = sum(x.first_token_s - x.arrival_s for x in streams)
    e2el = sum(x.last_token_s - x.arrival_s for x in streams)
    assert st.ttft.total == pytest.approx(ttft, abs=1e-12)
    assert st.e2el.total == pytest.approx(e2el, abs=1e-12)
    assert st.itl.total == pytest.approx(e2el - ttft, abs=1e-12)   # the gaps add up


def test_driver_rejects_what_can_never_run_and_pins_replicas(tmp_path):
    text = SCENARIO.replace("scheduler:", "cluster: {replicas: 2, router: round_robin}\n"
                                          "scheduler:")
    s = load_scenario(write_scenario(tmp_path, text))
    sim, streams, counts, stats = run_live(
        s, [(0.0, 5000, 4, None), (0.0, 100, 3, 1), (0.0, 100, 3, 1), (0.0, 100, 2, None)],
        record=True)
    assert streams[0].done and streams[0].reject_reason == "exceeds_max_model_len"
    assert counts == [0, 3, 3, 2]
    replicas = {r.request_id: r.replica for r in sim.served}
    assert replicas[1] == replicas[2] == 1
    # the router saw only #0 (to replica 0, rejected there) and #3 (round robin: replica 1)
    assert [st.requests_finished for st in stats] == [0, 3]


def live_and_offline(tmp_path: Path, text: str):
    """Serve 30 random requests live under the scenario ``text``, record the arrivals it saw,
    and run them offline (``simserve run`` of the recorded trace): (served, offline) tables,
    both sorted by request id and checked to hold all 30."""
    from simserve.live.serve import write_record
    from simserve.runner import run

    s = load_scenario(write_scenario(tmp_path, text))
    rng = np.random.default_rng(1)
    plan = [(float(rng.exponential(0.02)), int(rng.integers(50, 1500)),
             int(rng.integers(2, 40)), None) for _ in range(30)]
    sim, _, _, _ = run_live(s, plan, record=True)
    write_record(sim.served, tmp_path / "rec")
    replayed = load_scenario(write_scenario(tmp_path, text.split("workload:")[0] + (
        f"workload: {{trace: {tmp_path / 'rec' / 'trace.csv'}, format: csv}}\n"), "t.yaml"))
    offline = run(replayed).requests.sort_values("request_id")
    served = pd.read_csv(tmp_path / "rec" / "served.csv")
    assert len(served) == len(offline) == 30
    return served, offline


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_same_arrivals_give_the_same_schedule_as_simserve_run(tmp_path, async_scheduling):
    """The live schedule is the engine's: ``simserve run`` of a trace of the arrivals it saw
    gives the very same token times (also with vLLM's async scheduling: a batch queue)."""
    text = SCENARIO.replace("max_model_len: 4096}", "max_model_len: 4096, "
                            "async_scheduling: true}") if async_scheduling else SCENARIO
    assert load_scenario(write_scenario(tmp_path, text)).engine.async_scheduling \
        is async_scheduling
    served, offline = live_and_offline(tmp_path, text)
    np.testing.assert_allclose(served["arrival_s"], offline["arrival_s"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(served["first_token_s"], offline["first_token_s"], rtol=0,
                               atol=1e-9)
    np.testing.assert_allclose(served["finish_s"], offline["finish_s"], rtol=0, atol=1e-9)


def test_disaggregated_cluster_live_equals_simserve_run(tmp_path):
    """Prefill and decode replicas: a request's first token leaves when its KV lands on the
    decode replica, and the whole schedule is still the engine's."""
    from simserve.live.serve import write_record
    from simserve.runner import run

    text = SCENARIO.replace("scheduler:", "cluster:\n  groups:\n"
                            "    - {name: p, role: prefill, replicas: 1}\n"
                            "    - {name: d, role: decode, replicas: 2}\n"
                            "  kv_transfer: {link: nvlink}\nscheduler:")
    s = load_scenario(write_scenario(tmp_path, text))
    plan = [(0.004 * (i % 3), 100 + 37 * i, 1 + 3 * i, None) for i in range(12)]
    sim, streams, counts, stats = run_live(s, plan, record=True)
    assert counts == [1 + 3 * i for i in range(12)]
    assert sum(st.requests_finished for st in stats) == 12
    write_record(sim.served, tmp_path / "rec")
    replayed = load_scenario(write_scenario(tmp_path, text.split("workload:")[0] + (
        f"workload: {{trace: {tmp_path / 'rec' / 'trace.csv'}, format: csv}}\n"), "t.yaml"))
    offline = run(replayed).requests.sort_values("request_id")
    served = pd.read_csv(tmp_path / "rec" / "served.csv")
    np.testing.assert_allclose(served["first_token_s"], offline["first_token_s"], rtol=0,
                               atol=1e-9)
    np.testing.assert_allclose(served["finish_s"], offline["finish_s"], rtol=0, atol=1e-9)


def test_a_scenario_with_failures_is_refused(tmp_path):
    from simserve.errors import ConfigError
    from simserve.live.driver import WallClockSimulation
    text = SCENARIO.replace("scheduler:", "cluster: {replicas: 2, faults: {mtbf_s: 100, "
                                          "restart_s: 5}}\nscheduler:")
    s = load_scenario(write_scenario(tmp_path, text))

    async def make():
        WallClockSimulation(s)

    with pytest.raises(ConfigError, match="cluster.faults"):
        asyncio.run(make())


# -- the command ---------------------------------------------------------------------------

def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "simserve.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, field", [
    (["--host", "0.0.0.0"], "--host"),
    (["--host", "10.1.2.3"], "--host"),
    (["--port", "70000"], "--port"),
    (["--port", "-1"], "--port"),
    (["--served-model-name", ""], "--served-model-name"),     # served the scenario's name
    (["--served-model-name", " "], "--served-model-name"),
])
def test_refuses_to_bind_what_it_should_not(tmp_path, args, field):
    path = write_scenario(tmp_path)
    out = cli("serve", str(path), *args, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith(f"error: {field}:") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_bad_input_is_one_line(tmp_path):
    path = write_scenario(tmp_path)
    missing = cli("serve", str(tmp_path / "none.yaml"), cwd=tmp_path)
    bad = cli("serve", str(path), "--set", "engine.max_num_seqs=0", cwd=tmp_path)
    for out, starts in ((missing, f"error: {tmp_path / 'none.yaml'}: file not found"),
                        (bad, "error: engine.max_num_seqs: must be >= 1")):
        assert out.returncode == 2 and out.stderr.startswith(starts), out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_a_port_in_use_is_one_line(tmp_path):
    path = write_scenario(tmp_path)
    proc, [url] = start_server(path, tmp_path)
    try:
        out = cli("serve", str(path), "--port", url.rsplit(":", 1)[1], cwd=tmp_path)
    finally:
        stop_server(proc)
    assert out.returncode == 2 and out.stderr.startswith("error: --port: cannot listen on")
    assert len(out.stderr.strip().splitlines()) == 1


def start_server(path: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "simserve.cli", "serve", str(path),
                             "--port", "0", *extra], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    urls: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("serving "):
            urls.append(line.split(" on ")[-1].strip())
            if "--port-per-replica" not in extra or len(urls) == 2:
                return proc, urls
    proc.kill()
    raise AssertionError(f"server did not start: {proc.stderr.read()}")


def stop_server(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    # which step-time model serves, as a run's line says it
    assert "latency: roofline (H100-SXM spec, h100-vllm efficiency curves; estimate); stop " \
        "with Ctrl-C or SIGTERM" in err
    # the KV capacity logged as vLLM logs it, which `simserve calibrate --server-log` reads
    from simserve.live.calibrate import kv_tokens_from_log
    assert kv_tokens_from_log(err) is not None and kv_tokens_from_log(err) > 0
    return out


def test_serve_replayed_matches_simserve_run(tmp_path):
    """``simserve replay`` against ``simserve serve`` of one scenario measures what ``simserve
    run`` predicts: the server's schedule exactly (given the arrivals it saw), the client's
    numbers within the HTTP path's delay (bounds loose enough for a busy CI machine; the
    benchmark benchmarks/serve_bench.py measures them)."""
    from simserve.live.replay import replay
    from simserve.runner import run

    path = write_scenario(tmp_path)
    proc, [url] = start_server(path, tmp_path, "--record", "rec")
    try:
        got = replay(path, url, warmup=0)
    finally:
        out = stop_server(proc)
    assert "stopped after 60 requests; record in rec/" in out
    assert got.summary["num_failed"] == 0 and got.summary["token_count_mismatches"] == 0

    # 1. the server's schedule is the engine's for the arrivals it saw
    served = pd.read_csv(tmp_path / "rec" / "served.csv")
    replayed = load_scenario(write_scenario(tmp_path, SCENARIO.split("workload:")[0] + (
        f"workload: {{trace: {tmp_path / 'rec' / 'trace.csv'}, format: csv}}\n"), "t.yaml"))
    offline = run(replayed).requests.sort_values("request_id")
    np.testing.assert_allclose(served["finish_s"], offline["finish_s"], rtol=0, atol=1e-9)

    # 2. the client saw each request's tokens after the simulation emitted them, and soon after
    client = got.requests.sort_values("arrival_s").reset_index(drop=True)
    sim_ttft = (served["first_token_s"] - served["arrival_s"]).to_numpy()
    sim_e2el = (served["finish_s"] - served["arrival_s"]).to_numpy()
    assert (client["num_prompt_tokens"].to_numpy() == served["num_prompt_tokens"]).all()
    late_ttft = client["ttft_s"].to_numpy() - sim_ttft
    late_e2el = client["e2el_s"].to_numpy() - sim_e2el
    assert late_ttft.min() > -1e-3 and late_e2el.min() > -1e-3   # never before
    assert np.median(late_ttft) < 0.05 and np.median(late_e2el) < 0.05

    # 3. and `simserve run` of the scenario itself, arrivals as scheduled, agrees per request
    predicted = run(load_scenario(path)).requests.set_index("request_id")
    measured = got.requests.set_index("request_id")
    d_tpot = (measured["tpot_s"] - predicted["tpot_s"]).abs()
    assert np.median(d_tpot) < 0.002
    d_e2el = (measured["e2el_s"] - predicted["e2el_s"]).abs()
    assert np.median(d_e2el) < 0.05


def test_serve_per_replica_ports_and_metrics(tmp_path):
    import aiohttp
    text = SCENARIO.replace("scheduler:", "cluster: {replicas: 2}\nscheduler:")
    path = write_scenario(tmp_path, text)
    proc, urls = start_server(path, tmp_path, "--port-per-replica")

    async def probe():
        async with aiohttp.ClientSession() as s:
            async with s.post(urls[1] + "/v1/completions", json={
                    "prompt": [5] * 20, "max_tokens": 3, "ignore_eos": True}) as r:
                body = await r.json()
            metrics = []
            for url in urls:
                async with s.get(url + "/metrics") as r:
                    metrics.append(await r.text())
        return body, metrics

    try:
        body, metrics = asyncio.run(probe())
    finally:
        stop_server(proc)
    assert body["usage"]["completion_tokens"] == 3
    assert 'vllm:generation_tokens_total{engine="1",model_name="Llama-3.1-8B"} 3.0' in metrics[1]
    assert 'engine="1"' not in metrics[0]
    assert 'vllm:generation_tokens_total{engine="0",model_name="Llama-3.1-8B"} 0.0' in metrics[0]


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_sigint_stops_it_cleanly_mid_stream(tmp_path):
    import aiohttp
    path = write_scenario(tmp_path)
    proc, [url] = start_server(path, tmp_path)

    async def one_long_stream():
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/completions", json={
                    "prompt": [5] * 20, "max_tokens": 4000, "ignore_eos": True,
                    "stream": True}) as r:
                await r.content.readline()      # streaming has begun
                proc.send_signal(signal.SIGINT)
                try:
                    return await r.read()
                except aiohttp.ClientError:
                    return b""

    asyncio.run(asyncio.wait_for(one_long_stream(), 30))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "stopped after 1 requests" in out


def _send(url: str, data: bytes, read: bool = True) -> bytes:
    """Raw bytes to the server; its answer's status line and headers ("" if not read)."""
    import socket
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        while b"\r\n\r\n" not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def test_malformed_requests_and_clients_that_leave_print_no_traceback(tmp_path):
    # aiohttp answers these 400 itself but logged each with a traceback; a client that sent
    # half its body and left made the handler raise (a traceback and a 500 for no one)
    path = write_scenario(tmp_path)
    proc, [url] = start_server(path, tmp_path)
    try:
        answers = [_send(url, data) for data in (
            b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(
                b"X-%d: y\r\n" % i for i in range(10_000)) + b"\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}",
        )]
        _send(url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
                   b'{"prompt": [1, 2', read=False)
        time.sleep(0.5)
        too_large = _send(url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Length: 68157440\r\n\r\n")    # headers only
        ok = _send(url, b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 32\r\n'
                        b'\r\n{"prompt": [5], "max_tokens": 1}')
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert all(a.split(b" ", 2)[1] == b"400" for a in answers), answers
    assert too_large.startswith(b"HTTP/1.1 413 ") and ok.startswith(b"HTTP/1.1 200 ")
    assert proc.returncode == 0
    assert "Traceback" not in err, err
    # one line for each malformed request, none for the client that left before the handler
    lines = [ln for ln in err.splitlines() if ln.startswith("simserve serve: ")]
    assert len(lines) == 3 and all("malformed request answered 400" in ln for ln in lines), err


@pytest.mark.parametrize("where", ["s.yaml/rec", "/proc/simserve-no-such/rec"])
def test_an_unwritable_record_folder_is_refused_before_serving(tmp_path, where):
    path = write_scenario(tmp_path)
    out = cli("serve", str(path), "--port", "0", "--record", where, cwd=tmp_path)  # 60 s cap
    assert out.returncode == 2 and out.stderr.startswith("error: --record: cannot write into")
    assert len(out.stderr.strip().splitlines()) == 1 and "serving" not in out.stdout


def test_metrics_count_finished_requests_by_the_finish_reason_answered(tmp_path):
    # every finished request was counted as finished_reason="length", a "stop" one too
    from simserve.config import load_scenario
    from simserve.live.driver import WallClockSimulation
    from simserve.live.http import prometheus_text

    async def main():
        sim = WallClockSimulation(load_scenario(write_scenario(tmp_path)))
        streams = [sim.submit(50, 3, None, finish_reason="stop"),
                   sim.submit(40, 2, None, finish_reason="stop"), sim.submit(30, 2, None)]
        for s in streams:
            while await s.take():
                pass
        stats = sim.stats()
        sim.close()
        return stats

    [st] = asyncio.run(main())
    assert st.requests_finished == 3 and st.finished_by_reason == {"stop": 2, "length": 1}
    text = prometheus_text("m", [st])
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0' \
        in text
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} ' \
        '1.0' in text


def test_a_request_cut_at_shutdown_is_in_the_record(tmp_path):
    # "stopped after 18 requests" while served.csv held the 16 that had finished
    import pandas as pd

    from simserve.config import load_scenario
    from simserve.live.driver import CUT_AT_SHUTDOWN, WallClockSimulation
    from simserve.live.serve import write_record

    async def main():
        sim = WallClockSimulation(load_scenario(write_scenario(tmp_path)), record=True)
        done = sim.submit(30, 1, None)
        while await done.take():
            pass
        cut = sim.submit(30, 4000, None)        # far from done when the server stops
        await asyncio.sleep(0.05)
        sim.close()
        assert cut.done and cut.taken < 4000
        return sim

    sim = asyncio.run(main())
    write_record(sim.served, tmp_path / "rec")
    served = pd.read_csv(tmp_path / "rec" / "served.csv", keep_default_na=False)
    assert len(served) == sim.num_submitted == 2
    assert list(served["reject_reason"]) == ["", CUT_AT_SHUTDOWN]
    assert len(pd.read_csv(tmp_path / "rec" / "trace.csv")) == 2
