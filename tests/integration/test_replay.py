"""The replay client against a real streaming HTTP server on 127.0.0.1 (not a mock of the
client): exact token counts with multi-token chunks, HTTP errors, timeouts, bounds, an
unreachable endpoint, the loopback rule, and `simserve compare` on a replayed directory."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

# aiohttp is a dependency of simserve (replay, calibrate, serve): imported, never skipped
from aiohttp import web  # noqa: E402

from simserve.cli import main  # noqa: E402
from simserve.live.replay import EndpointError, check_endpoint_host, replay  # noqa: E402
from simserve.runner import REQUEST_COLUMNS  # noqa: E402


class FakeServer:
    """A real HTTP server in a thread, answering ``/v1/completions`` like vLLM's OpenAI server
    in streaming mode: SSE ``data: {...}`` lines whose choices carry ``token_ids`` (several per
    chunk when ``chunk_sizes`` says so), a final usage chunk, then ``data: [DONE]``.

    Timing: the first chunk ``ttft_s`` after the request, each later chunk of n tokens
    ``n * token_s`` after the previous one. ``behaviour(body) -> str | None`` picks a fault per
    request: ``"500"`` (HTTP 500), ``"stall"`` (no answer for a long time), ``"short"`` (one
    token fewer than asked, usage telling the truth), ``"bad_usage"`` (usage off by one).
    """

    def __init__(self, *, ttft_s: float = 0.02, token_s: float = 0.004,
                 chunk_sizes: tuple[int, ...] = (1,), behaviour=None, handler=None):
        self.ttft_s, self.token_s, self.chunk_sizes = ttft_s, token_s, chunk_sizes
        self.behaviour = behaviour or (lambda body: None)
        self.bodies: list[dict] = []
        self.sent_chunks: dict[int, list[tuple[float, int]]] = {}
        self._handler = handler or self._completions
        # its own loop, made when it is served in its thread (a server started on a test's
        # loop instead, start_here, has none: an unused loop left open leaked its sockets)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._sock = sock
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> FakeServer:
        self._loop = asyncio.new_event_loop()
        self._thread.start()
        assert self._ready.wait(10), "fake server did not start"
        return self

    def __exit__(self, *exc) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def _serve(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        runner = await self.start_here()
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await self.stop_here(runner)

    async def start_here(self) -> web.AppRunner:
        """Serve on the running event loop (instead of the server's own thread): what a test
        on a simulated clock does (tests/integration/test_calibrate.py)."""
        # aiohttp wants coroutine handlers (bare functions are deprecated) and the shutdown
        # timeout on the runner, not the site
        async def health(request: web.Request) -> web.Response:
            return web.Response(text="")

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "fake-model"}]})

        async def version(request: web.Request) -> web.Response:
            return web.json_response({"version": "fake-1.0"})

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/version", version)
        app.router.add_post("/v1/completions", self._handler)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        await web.SockSite(runner, self._sock).start()
        return runner

    @staticmethod
    async def stop_here(runner: web.AppRunner) -> None:
        await runner.cleanup()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:            # e.g. a fake engine's loop
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    # -- the endpoint ----------------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        fault = self.behaviour(body)
        if fault == "500":
            return web.Response(status=500, text="engine died")
        if fault == "stall":
            await asyncio.sleep(30)
        n = body["max_tokens"] - (1 if fault == "short" else 0)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(self.ttft_s)
        key = len(body["prompt"]) * 100000 + body["max_tokens"]
        log = self.sent_chunks.setdefault(key, [])
        sent, k = 0, 0
        while sent < n:
            size = min(self.chunk_sizes[k % len(self.chunk_sizes)], n - sent)
            if k:
                await asyncio.sleep(self.token_s * size)
            ids = list(range(100 + sent, 100 + sent + size))
            chunk = {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                     "choices": [{"index": 0, "text": " ".join(f"w{i}" for i in ids),
                                  "token_ids": ids, "finish_reason": None}], "usage": None}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            log.append((time.perf_counter(), size))
            sent += size
            k += 1
        usage = {"prompt_tokens": len(body["prompt"]),
                 "completion_tokens": n + (1 if fault == "bad_usage" else 0),
                 "total_tokens": len(body["prompt"]) + n}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def write_scenario(tmp_path: Path, rows: list[tuple[float, int, int]], **engine) -> Path:
    """A scenario replaying exactly ``rows`` = (arrival_s, prompt_tokens, output_tokens)."""
    trace = tmp_path / "trace.csv"
    pd.DataFrame(rows, columns=["arrival_s", "prompt_tokens", "output_tokens"]).to_csv(
        trace, index=False)
    knobs = {"max_num_seqs": 32, "max_num_batched_tokens": 512, "block_size": 32,
             "max_model_len": 2048, "num_gpu_blocks": 1024, **engine}
    lines = ["name: fake", "seed: 3", "model: tiny-llama-45m", "hardware: cpu-epyc-2core",
             "engine:", *[f"  {k}: {v}" for k, v in knobs.items()],
             "scheduler: {policy: vllm_v1}", "latency: {model: constant, step_ms: 5}",
             "workload: {trace: trace.csv, format: csv}"]
    path = tmp_path / "scenario.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_multi_token_chunks_are_counted_exactly(tmp_path, monkeypatch):
    rows = [(0.0, 40, 10), (0.01, 70, 7), (0.02, 33, 1), (0.05, 128, 12)]
    res = replay_on_a_simulated_clock(
        monkeypatch, FakeServer(chunk_sizes=(1, 3, 2), ttft_s=0.03, token_s=0.004),
        write_scenario(tmp_path, rows), warmup=1)
    req = res.requests.sort_values("request_id")
    assert list(req.columns[:len(REQUEST_COLUMNS)]) == list(REQUEST_COLUMNS)
    assert (req["status"] == "finished").all(), req["error"].tolist()
    assert req["num_output_tokens"].tolist() == [10, 7, 1, 12]
    assert req["usage_output_tokens"].tolist() == [10, 7, 1, 12]
    # chunks of 1, 3, 2, 1, 3, ... tokens: 10 tokens -> 1+3+2+1+3 = 10 in 5 chunks
    assert req["num_chunks"].tolist() == [5, 4, 1, 6]
    assert (req["error"] == "").all()
    tokens = res.tokens()
    assert len(tokens) == 30
    assert tokens.groupby("request_id").size().tolist() == [10, 7, 1, 12]
    # every token carries its chunk's arrival time: the second chunk's 3 tokens share one time
    t0 = tokens[tokens["request_id"] == 0]["time_s"].to_numpy()
    assert t0[1] == t0[2] == t0[3] and t0[4] == t0[5] and t0[0] < t0[1]
    s = res.summary
    assert s["completed"] == 4 and s["num_failed"] == 0 and s["total_output_tokens"] == 30
    assert s["total_chunks"] == 16
    # on the simulated clock, TTFT is the server's first-chunk delay, 30 ms, and each later
    # chunk of n tokens comes n x 4 ms after the one before: E2EL = 30 ms + 4 ms x (tokens - 1)
    # (10 tokens: 66 ms; 7: 54; 1: 30; 12: 74) and TPOT uses tokens, not chunks: 4 ms
    assert req["ttft_s"].tolist() == pytest.approx([0.03] * 4, abs=1e-12)
    assert req["e2el_s"].tolist() == pytest.approx([0.066, 0.054, 0.03, 0.074], abs=1e-12)
    r0 = req.iloc[0]
    assert r0["tpot_s"] == pytest.approx((r0["e2el_s"] - r0["ttft_s"]) / 9)
    assert req["tpot_s"].dropna().tolist() == pytest.approx([0.004] * 3)
    # ITL as vllm bench records it: one gap per chunk after the first (15 - 4 + ... = 12)
    gaps = np.concatenate([np.diff(g.to_numpy()) for _, g in
                           res.chunks.groupby("request_id")["time_s"]])
    assert len(gaps) == 16 - 4
    assert s["median_itl_ms"] == pytest.approx(np.median(gaps) * 1000)
    # 4 ms a token: a 3-token chunk is 12 ms after the previous one
    assert s["median_tpot_ms"] == pytest.approx(4.0)
    assert sorted(np.round(gaps * 1000, 9)) == [4.0] * 3 + [8.0] * 4 + [12.0] * 5


def test_request_protocol(tmp_path):
    rows = [(0.0, 50, 5), (0.0, 50, 6)]
    with FakeServer() as srv:
        replay(write_scenario(tmp_path, rows), srv.url, warmup=0)
        replay(write_scenario(tmp_path, rows), srv.url, warmup=0)
    a, b, a2, b2 = srv.bodies
    for body, n in ((a, 5), (b, 6)):
        assert body["model"] == "fake-model" and body["stream"] is True
        assert body["max_tokens"] == body["min_tokens"] == n
        assert body["ignore_eos"] is True and body["return_token_ids"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert len(body["prompt"]) == 50
        assert all(isinstance(t, int) and 4 <= t < 32000 for t in body["prompt"])
    by_len = {a["max_tokens"]: a["prompt"], b["max_tokens"]: b["prompt"]}
    assert by_len[5][:8] != by_len[6][:8]          # no accidental shared prefix
    assert {a2["max_tokens"]: a2["prompt"], b2["max_tokens"]: b2["prompt"]} == by_len  # seeded


def test_http_500_and_timeouts_are_recorded_not_raised(tmp_path):
    rows = [(0.0, 40, 5), (0.0, 13, 5), (0.01, 17, 5), (0.02, 41, 4)]
    faults = {13: "500", 17: "stall"}
    with FakeServer(behaviour=lambda body: faults.get(len(body["prompt"]))) as srv:
        res = replay(write_scenario(tmp_path, rows), srv.url, warmup=0, timeout=0.5)
    req = res.requests.set_index("num_prompt_tokens")
    assert req.loc[13, "status"] == "failed" and req.loc[13, "http_status"] == 500
    assert req.loc[13, "error"].startswith("HTTP 500") and "engine died" in req.loc[13, "error"]
    assert req.loc[17, "status"] == "failed" and req.loc[17, "error"] == "timeout after 0.5 s"
    assert (req.loc[[40, 41], "status"] == "finished").all()
    s = res.summary
    assert s["num_requests"] == 4 and s["completed"] == 2 and s["num_failed"] == 2
    assert s["failed_by_error"] == {"HTTP 500": 1, "timeout": 1}
    assert s["total_output_tokens"] == 9


def test_token_count_mismatch_is_flagged(tmp_path):
    rows = [(0.0, 40, 5), (0.0, 41, 6)]
    faults = {40: "short", 41: "bad_usage"}
    with FakeServer(behaviour=lambda body: faults.get(len(body["prompt"]))) as srv:
        res = replay(write_scenario(tmp_path, rows), srv.url, warmup=0)
    req = res.requests.set_index("num_prompt_tokens")
    assert req.loc[40, "num_output_tokens"] == 4
    assert "5 were asked for" in req.loc[40, "error"]
    assert "usage says 7" in req.loc[41, "error"]
    assert res.summary["token_count_mismatches"] == 2


def replay_on_a_simulated_clock(monkeypatch, server: FakeServer, *args, **kwargs):
    """``replay(*args, **kwargs)`` against ``server``, both on one event loop whose clock jumps
    to the next timer (test_calibrate.py's VirtualClockLoop): the server's sleeps and the
    client's waits take no wall time, and what the client measures is the server's timing
    alone, on any machine under any load."""
    import types

    import simserve.live.client
    import simserve.live.replay
    from tests.integration.test_calibrate import run_beside

    clock = types.SimpleNamespace(perf_counter=lambda: asyncio.get_running_loop().time())
    with monkeypatch.context() as m:
        m.setattr(asyncio, "run", run_beside(server))
        m.setattr(simserve.live.client, "time", clock)
        m.setattr(simserve.live.replay, "time", clock)
        try:
            return replay(*args, server.url, **kwargs)
        finally:
            server._sock.close()


def test_bounds_max_requests_and_time_limit(tmp_path, monkeypatch):
    rows = [(0.1 * i, 30, 40) for i in range(30)]
    path = write_scenario(tmp_path, rows)
    few = replay_on_a_simulated_clock(monkeypatch, FakeServer(token_s=0.01), path, warmup=0,
                                      max_requests=3)
    assert few.summary["num_requests"] == 3 and few.summary["completed"] == 3
    # each request takes 0.02 s to its first token and 39 x 0.01 s more: 0.41 s; the last of
    # the three arrives at 0.2 s and ends at 0.61 s
    assert few.meta["wall_s"] == pytest.approx(0.61)
    cut = replay_on_a_simulated_clock(monkeypatch, FakeServer(token_s=0.01), path, warmup=0,
                                      time_limit=0.35)
    # arrivals at 0, 0.1, 0.2, 0.3 are sent; each needs 0.41 s, so all are cut at 0.35 s
    assert cut.summary["num_requests"] == 4 and cut.meta["num_not_sent"] == 26
    assert cut.summary["failed_by_error"] == {"time limit": 4}
    # it stopped at the limit, not after the last arrival (2.9 s) nor when the four streams
    # ended (0.71 s): on the simulated clock, exactly at 0.35 s
    assert cut.meta["wall_s"] == pytest.approx(0.35)


def test_unreachable_endpoint_refuses_to_start(tmp_path, capsys):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                     # nothing listens there now
    path = write_scenario(tmp_path, [(0.0, 10, 2)])
    with pytest.raises(EndpointError, match="unreachable"):
        replay(path, f"http://127.0.0.1:{port}")
    code = main(["replay", str(path), "--endpoint", f"http://127.0.0.1:{port}",
                 "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and "unreachable" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("url, why", [
    ("http://10.0.0.5:8000", "10.0.0.5 is not a loopback address"),
    ("http://example.com:80", "example.com is not a loopback address"),
    ("http://192.168.1.2", "192.168.1.2 is not a loopback address"),
    ("ftp://127.0.0.1", "expected http://HOST:PORT, got 'ftp://127.0.0.1'")])
def test_non_loopback_endpoints_are_refused(url, why):
    with pytest.raises(EndpointError, match=f"^--endpoint: {re.escape(why)}"):
        check_endpoint_host(url)


def test_loopback_endpoints_are_accepted():
    assert check_endpoint_host("http://127.0.0.1:8011/") == "http://127.0.0.1:8011"
    assert check_endpoint_host("http://localhost:1") == "http://localhost:1"
    assert check_endpoint_host("http://[::1]:8011") == "http://[::1]:8011"
    assert check_endpoint_host("http://10.0.0.5:8000/", allow_remote=True) == \
        "http://10.0.0.5:8000"


def test_cli_replay_writes_run_files_and_compare_reads_them(tmp_path, capsys):
    rows = [(0.02 * i, 64, 8) for i in range(6)]
    path = write_scenario(tmp_path, rows)
    with FakeServer(ttft_s=0.02, token_s=0.005, chunk_sizes=(2,)) as srv:
        code = main(["replay", str(path), "--endpoint", srv.url, "--out",
                     str(tmp_path / "real"), "--warmup", "0", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "note: replacing" not in err
    real = tmp_path / "real"
    for name in ("scenario.yaml", "requests.csv", "steps.csv", "summary.json", "tokens.csv",
                 "chunks.csv", "replay.json"):
        assert (real / name).is_file(), name
    # a second replay into the same folder says it replaces the first (it did so silently)
    with FakeServer(ttft_s=0.02, token_s=0.005, chunk_sizes=(2,)) as srv:
        assert main(["replay", str(path), "--endpoint", srv.url, "--out", str(real),
                     "--warmup", "0", "--quiet"]) == 0
    assert f"note: replacing the results already in {real}/" in capsys.readouterr().err
    req = pd.read_csv(real / "requests.csv", keep_default_na=False)
    assert len(req) == 6 and set(req["status"]) == {"finished"}
    assert len(pd.read_csv(real / "tokens.csv")) == 48
    meta = json.loads((real / "replay.json").read_text())
    assert meta["engine_version"] == "fake-1.0" and meta["model"] == "fake-model"
    # simulate the same scenario, then compare column by column
    assert main(["run", str(path), "--out", str(tmp_path / "sim"), "--quiet",
                 "--no-report"]) == 0
    sim_req = pd.read_csv(tmp_path / "sim" / "requests.csv")
    assert list(sim_req.columns) == list(req.columns[:len(sim_req.columns)])
    capsys.readouterr()
    assert main(["compare", str(real), str(tmp_path / "sim")]) == 0
    out, _ = capsys.readouterr()
    assert "TTFT p50" in out and "rel. error" in out and "output tok/s" in out
    # a simulated run written into the replay's folder: the replay's own files go too (they
    # described a server the run never saw)
    assert main(["run", str(path), "--out", str(real), "--quiet", "--no-report"]) == 0
    assert (f"note: replacing the results of a replay in {real}/ with a run's (removed "
            "chunks.csv, replay.json)") in capsys.readouterr().err
    assert not (real / "replay.json").exists() and not (real / "chunks.csv").exists()


def test_replay_summary_shows_no_scheduler_figures_a_client_cannot_see(tmp_path, capsys):
    """A client sees tokens, not the server's steps, queues or KV cache: the replay's summary
    said 'Engine steps: 0', 'Mean running requests: 0.00', 'Max KV cache utilization (%): 0.00'
    for a server that ran; it now says the section is not observed."""
    path = write_scenario(tmp_path, [(0.02 * i, 64, 8) for i in range(3)])
    with FakeServer(ttft_s=0.02, token_s=0.005, chunk_sizes=(2,)) as srv:
        code = main(["replay", str(path), "--endpoint", srv.url, "--out",
                     str(tmp_path / "real"), "--warmup", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Mean TTFT (ms):" in out and "Successful requests:" in out
    for label in ("Engine steps:", "Preemptions:", "Mean running requests:",
                  "KV cache utilization", "Mean batched tokens per step:"):
        assert label not in out, label
    assert "not observed by a client" in out


# Streams whose JSON parses but is not shaped as an OpenAI stream chunk: each request fails
# with a message naming the chunk, never a traceback (issue #20's wrong-shape JSON).
WRONG_SHAPES = {
    11: b'[1, 2, 3]',                                             # a list, not an object
    12: b'"text"',                                                # a bare string
    13: b'{"choices": {"text": "x"}}',                            # choices not a list
    14: b'{"choices": ["x"]}',                                    # a choice not a mapping
    15: b'{"choices": [{"token_ids": 7}]}',                      # token_ids not a list
    16: b'{"choices": [], "usage": [1]}',                         # usage not a mapping
    17: b'{"choices": [], "usage": {"completion_tokens": "two"}}',   # counts not integers
}


def test_wrong_shape_stream_chunks_fail_the_request_with_a_message(tmp_path):
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        good = {"choices": [{"index": 0, "text": "w", "token_ids": [5]}]}
        await resp.write(f"data: {json.dumps(good)}\n\n".encode())
        await resp.write(b"data: " + WRONG_SHAPES[len(body["prompt"])] + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    rows = [(0.01 * i, n, 3) for i, n in enumerate(WRONG_SHAPES)]
    with FakeServer(handler=handler) as srv:
        res = replay(write_scenario(tmp_path, rows), srv.url, warmup=0, timeout=5)
    req = res.requests.set_index("num_prompt_tokens")
    assert (req["status"] == "failed").all()
    for n in WRONG_SHAPES:
        assert req.loc[n, "error"].startswith("bad stream chunk"), (n, req.loc[n, "error"])
    assert res.summary["num_failed"] == len(WRONG_SHAPES)


@pytest.mark.parametrize("kwargs, expect", [
    ({"timeout": float("inf")}, "--timeout: must be > 0 and finite, got inf"),  # a traceback
    ({"timeout": float("nan")}, "--timeout: must be > 0 and finite, got nan"),  # aiohttp's
    ({"warmup": 10**9}, "--warmup: must be 0 to 1000, got 1000000000"),         # never ended
    ({"warmup": -1}, "--warmup: must be 0 to 1000, got -1"),
])
def test_client_options_are_refused_before_any_request(tmp_path, kwargs, expect):
    from simserve.errors import SimserveError
    path = write_scenario(tmp_path, [(0.0, 10, 2)])
    with pytest.raises(SimserveError) as info:      # nothing listens on port 9
        replay(path, "http://127.0.0.1:9", **kwargs)
    assert str(info.value) == expect


@pytest.mark.parametrize("args, expect", [
    (["--timeout", "inf"], "error: --timeout: must be > 0 and finite, got inf"),
    (["--out", "{d}/afile"], "error: {d}/afile: cannot create output directory (File exists)"),
    (["--out", "{d}/afile/sub"], "error: {d}/afile/sub: cannot create output directory "
                                 "({d}/afile is not a directory)"),
])
def test_cli_replay_checks_its_options_and_output_folder_first(tmp_path, capsys, args, expect):
    # the output folder was found unusable only after the whole real run, which was lost
    path = write_scenario(tmp_path, [(0.0, 10, 2)])
    (tmp_path / "afile").write_text("a file\n")
    argv = ["replay", str(path), "--endpoint", "http://127.0.0.1:9", "--out",
            str(tmp_path / "out"), *args]
    code = main([a.replace("{d}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err == expect.replace("{d}", str(tmp_path)) + "\n"


GOOD_SUMMARY = {"num_requests": 3, "total_input_tokens": 30, "total_output_tokens": 6,
                "median_ttft_ms": 10.0, "completed": 3}


@pytest.mark.parametrize("real, expect", [
    # each was a traceback from the arithmetic or a table of n/a with exit 0
    ({**GOOD_SUMMARY, "median_ttft_ms": "x"}, "median_ttft_ms: expected a number, got 'x'"),
    ({**GOOD_SUMMARY, "num_requests": "x"}, "num_requests: expected a number, got 'x'"),
    ({**GOOD_SUMMARY, "completed": True}, "completed: expected a number, got True"),
    ([1, 2], "expected a JSON object of metrics, got list"),
    ({"a": 1}, "holds none of the compared metrics"),
])
def test_compare_refuses_a_summary_that_is_not_one(tmp_path, capsys, real, expect):
    for name, summary in (("real", real), ("sim", GOOD_SUMMARY)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    code = main(["compare", str(tmp_path / "real"), str(tmp_path / "sim")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(f"error: {tmp_path / 'real' / 'summary.json'}: {expect}")
    assert err.count("\n") == 1 and err.endswith("\n")


@pytest.mark.parametrize("csv, expect", [
    ("{d}", "error: --csv: {d} is a directory; give the file to write"),
    ("{d}/afile/t.csv", "error: {d}/afile: cannot create output directory (File exists)"),
])
def test_compare_checks_its_csv_path_before_printing(tmp_path, capsys, csv, expect):
    # both were tracebacks from pandas after the table had been printed
    for name in ("real", "sim"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(GOOD_SUMMARY))
    (tmp_path / "afile").write_text("a file\n")
    code = main(["compare", str(tmp_path / "real"), str(tmp_path / "sim"), "--csv",
                 csv.replace("{d}", str(tmp_path))])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err == expect.replace("{d}", str(tmp_path)) + "\n"


def test_compare_writes_its_csv_into_a_new_folder(tmp_path, capsys):
    for name in ("real", "sim"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(GOOD_SUMMARY))
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "sim"), "--csv",
                 str(tmp_path / "new" / "t.csv")]) == 0
    table = pd.read_csv(tmp_path / "new" / "t.csv", index_col=0)
    assert table.loc["TTFT p50 ms", "sim"] == 10.0


def test_an_openai_base_url_ending_in_v1_is_the_server_root(tmp_path, capsys):
    # http://HOST:PORT/v1 is what OpenAI client configs hold (base_url); it used to become
    # http://HOST:PORT/v1/v1/models, a 404, reported as "/v1/models names no model"
    assert check_endpoint_host("http://127.0.0.1:8011/v1") == "http://127.0.0.1:8011"
    assert check_endpoint_host("http://localhost:8011/v1/") == "http://localhost:8011"
    path = write_scenario(tmp_path, [(0.0, 10, 2)])
    with FakeServer() as srv:
        code = main(["replay", str(path), "--endpoint", srv.url + "/v1", "--out",
                     str(tmp_path / "real"), "--warmup", "0", "--quiet"])
    _, err = capsys.readouterr()
    assert code == 0, err
    meta = json.loads((tmp_path / "real" / "replay.json").read_text())
    assert meta["endpoint"] == srv.url and meta["model"] == "fake-model"
    assert len(pd.read_csv(tmp_path / "real" / "tokens.csv")) == 2


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:abc",
                                 "http://127.0.0.1:1 /v1"])
def test_an_endpoint_with_a_bad_port_is_refused_not_called_unreachable(url):
    # aiohttp refused the URL, which was reported as "unreachable; is the server running?"
    with pytest.raises(EndpointError, match=r"^--endpoint: expected http://HOST:PORT, got "):
        check_endpoint_host(url)


@pytest.mark.parametrize("suffix", ["/v1/completions", "/v1/chat/completions/", "/v1/models",
                                    "/health", "/?x=1", "/llama/v1/completions"])
def test_an_endpoint_with_a_route_is_refused_naming_the_root_url(tmp_path, capsys, suffix):
    path = write_scenario(tmp_path, [(0.0, 10, 2)])
    code = main(["replay", str(path), "--endpoint", "http://127.0.0.1:9" + suffix,
                 "--out", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: --endpoint: ")
    assert "root URL http://HOST:PORT" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_path_prefix_is_kept_as_the_root_of_a_server_behind_a_proxy():
    # a reverse proxy serving the engine under a prefix: its routes are the prefix's
    assert check_endpoint_host("http://127.0.0.1:8011/llama") == "http://127.0.0.1:8011/llama"
    assert check_endpoint_host("http://127.0.0.1:8011/llama/v1/") == \
        "http://127.0.0.1:8011/llama"
    assert check_endpoint_host("http://localhost:1/a/b/") == "http://localhost:1/a/b"


class NoModelsServer(FakeServer):
    """A server that streams completions but has no ``/v1/models`` route (a 404)."""

    async def start_here(self) -> web.AppRunner:
        async def health(request: web.Request) -> web.Response:
            return web.Response(text="")

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_post("/v1/completions", self._handler)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        await web.SockSite(runner, self._sock).start()
        return runner


def test_a_server_without_a_model_list_names_its_answer(tmp_path, capsys):
    path = write_scenario(tmp_path, [(0.0, 10, 2)])
    with NoModelsServer() as srv:
        code = main(["replay", str(path), "--endpoint", srv.url, "--out",
                     str(tmp_path / "real"), "--warmup", "0", "--quiet"])
        _, err = capsys.readouterr()
        assert code == 2
        assert err.count("\n") == 1
        assert err == f"error: {srv.url}: GET /v1/models answered HTTP 404; pass --model NAME\n"
        assert not (tmp_path / "real").exists()
        code = main(["replay", str(path), "--endpoint", srv.url, "--out",
                     str(tmp_path / "real"), "--warmup", "0", "--quiet", "--model", "m"])
        assert code == 0, capsys.readouterr().err
