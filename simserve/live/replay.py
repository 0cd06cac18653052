"""Replay a scenario's workload against a live OpenAI-compatible streaming server.

``simserve replay scenario.yaml --endpoint http://127.0.0.1:8011 --out DIR`` sends every request
of the scenario's workload at its arrival time to ``/v1/completions`` and records what came back,
so that a real run and a simulated run of the same scenario compare column by column
(``simserve compare REAL_DIR SIM_DIR``).

Request protocol (exact per-request timings)::

    {"model": M, "prompt": [token ids], "max_tokens": N, "min_tokens": N, "ignore_eos": true,
     "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
     "return_token_ids": true}

* The prompt is a list of random token ids >= 4 (ids 0-3 are the special tokens of the usual
  tokenizers), drawn from a stream seeded by the scenario's seed and the request id, so there is
  no accidental prefix sharing and the same scenario sends the same prompts every time.
* A streamed chunk may carry several tokens (the server merges outputs its HTTP side has not
  sent yet): tokens are counted from ``choices[0].token_ids``, never as one per chunk; the final
  ``usage`` chunk is checked against the count.

What is recorded, per request: the send time, every chunk's arrival and its token count, the
usage, and the HTTP status or error. Times are seconds on one monotonic clock from the start of
the replay (the first send is at ~0, like the simulator's first arrival).

Metric definitions follow ``vllm bench serve`` (``calculate_metrics`` and the OpenAI completions
request function of ``vllm/benchmarks``): TTFT = first chunk carrying a token - send; E2EL = last
token-carrying chunk - send; TPOT = (E2EL - TTFT) / (tokens - 1) with the *token* count; ITL is
one gap per chunk (a chunk of n tokens adds one gap, not n), which is what vLLM's benchmark
records. ``tokens.csv`` gives every token the arrival time of the chunk that carried it.

Bounded by construction: ``max_requests``, a wall-clock ``time_limit`` (no request is sent after
it; requests still in flight then are cancelled and recorded as failed), a per-request
``timeout``. Connection and HTTP errors are recorded per request (status ``failed``, ``error``
column) and summarised; only an unreachable endpoint (or a failed warm-up) stops the replay
before it starts. Only loopback hosts are accepted unless ``allow_remote``.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from simserve.errors import SimserveError
from simserve.live.client import (WARMUP_IDS, EndpointError, Outcome, check_client_options,
                                  check_endpoint_host, load_average, no_model, probe,
                                  prompt_ids, request_body, send)
from simserve.paths import (OUTPUT_FILES, REPORT_FILES, check_out_dir, clear_other_outputs,
                            make_out_dir)

if TYPE_CHECKING:   # the CLI builds its parser from this module: keep importing it cheap
    import pandas as pd

    from simserve.config import Scenario
    from simserve.workload import RequestSpec

# Columns of requests.csv beyond the simulator's (which come first, in the same order).
REPLAY_COLUMNS = ("scheduled_s", "num_chunks", "usage_output_tokens", "http_status", "error")
CHUNK_COLUMNS = ("request_id", "chunk_index", "time_s", "num_tokens")

__all__ = ["replay", "ReplayResult", "EndpointError", "check_endpoint_host", "REPLAY_COLUMNS",
           "CHUNK_COLUMNS"]


# --------------------------------------------------------------------------------------------
# The whole replay


@dataclass
class ReplayResult:
    """A replayed run: the same tables and summary as a simulated ``runner.Result``."""

    scenario: Scenario
    requests: pd.DataFrame
    chunks: pd.DataFrame
    summary: dict
    meta: dict

    def table(self) -> str:
        from simserve.metrics.summary import format_summary
        return format_summary(self.summary, title=f"replay: {self.scenario.name} "
                                                  f"@ {self.meta['endpoint']}",
                              scheduler=False)

    def tokens(self) -> pd.DataFrame:
        """Every output token: ``request_id``, ``token_index``, ``time_s`` (its chunk's time)."""
        import numpy as np
        import pandas as pd
        c = self.chunks
        n = c["num_tokens"].to_numpy(np.int64)
        ids = np.repeat(c["request_id"].to_numpy(np.int64), n)
        times = np.repeat(c["time_s"].to_numpy(float), n)
        # token index within its request: position in the run of equal request ids
        starts = np.r_[0, np.flatnonzero(np.diff(ids)) + 1] if len(ids) else np.empty(0, int)
        index = np.arange(len(ids)) - np.repeat(starts, np.diff(np.r_[starts, len(ids)]))
        return pd.DataFrame({"request_id": ids, "token_index": index.astype(np.int64),
                             "time_s": times})

    def save(self, out_dir: str | Path) -> Path:
        """scenario.yaml, requests.csv, steps.csv (header only: a server shows no steps),
        summary.json, tokens.csv, chunks.csv and replay.json (endpoint, version, load...)."""
        import pandas as pd
        import yaml

        from simserve.metrics.recorder import STEP_COLUMNS
        out = make_out_dir(out_dir)
        (out / "scenario.yaml").write_text(
            yaml.safe_dump(self.scenario.to_dict(), sort_keys=False))
        self.requests.to_csv(out / "requests.csv", index=False, float_format="%.9g")
        pd.DataFrame(columns=["step", *STEP_COLUMNS]).to_csv(out / "steps.csv", index=False)
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2, sort_keys=True)
                                          + "\n")
        self.tokens().to_csv(out / "tokens.csv", index=False, float_format="%.9g")
        self.chunks.to_csv(out / "chunks.csv", index=False, float_format="%.9g")
        (out / "replay.json").write_text(json.dumps(self.meta, indent=2, sort_keys=True) + "\n")
        return out


def replay(scenario: Scenario | str | Path, endpoint: str, *, model: str | None = None,
           max_requests: int | None = None, time_limit: float | None = None,
           timeout: float = 300.0, warmup: int = 2, allow_remote: bool = False,
           overrides: list[str] | None = None, log=None) -> ReplayResult:
    """Send the scenario's workload to ``endpoint`` and record it (see the module docstring).

    ``log`` (a callable taking one line) gets progress lines; None is silent.
    """
    from simserve.config import Scenario, load_scenario
    from simserve.workload import build_workload
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    if max_requests is not None and max_requests < 1:
        raise SimserveError(f"--max-requests: must be >= 1, got {max_requests}")
    if time_limit is not None and not time_limit > 0:
        raise SimserveError(f"--time-limit: must be > 0, got {time_limit:g}")
    check_client_options(timeout, warmup)
    endpoint = check_endpoint_host(endpoint, allow_remote)
    specs = build_workload(s.workload, s.seed, s.base_dir)
    if max_requests is not None:
        specs = specs[:max_requests]
    return asyncio.run(_replay(s, specs, endpoint, model, time_limit, timeout, warmup, log))


async def _replay(s: Scenario, specs: list[RequestSpec], endpoint: str, model: str | None,
                  time_limit: float | None, timeout: float, warmup: int, log) -> ReplayResult:
    import aiohttp

    from simserve.workload import RequestSpec
    say = log or (lambda line: None)
    # a fresh connection per request: a pooled keep-alive connection that the server closed
    # while idle would fail the next request ("Server disconnected")
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        info = await probe(session, endpoint, timeout=min(timeout, 10.0))
        model = model or info["model"]
        if not model:
            raise no_model(endpoint, info)
        url = f"{endpoint}/v1/completions"
        for i in range(warmup):
            rid = WARMUP_IDS + i          # their own prompts, never a workload request's
            w = Outcome(RequestSpec(rid, 0.0, 16, 4))
            await send(session, url, request_body(model, prompt_ids(s.seed, rid, 16,
                                                                     s.model.vocab_size), 4),
                        w, time.perf_counter(), timeout)
            if w.error:
                raise EndpointError(f"{url}: warm-up request failed ({w.error})")
        say(f"replaying {len(specs)} requests to {url} (model {model!r})")
        bodies = [request_body(model, prompt_ids(s.seed, r.request_id, r.num_prompt_tokens,
                                                 s.model.vocab_size), r.num_output_tokens)
                  for r in specs]
        outcomes = [Outcome(r) for r in specs]
        load_before = load_average()
        started = _dt.datetime.now(_dt.timezone.utc)
        t0 = time.perf_counter()
        deadline = math.inf if time_limit is None else time_limit

        async def one(i: int) -> None:
            delay = specs[i].arrival_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            await send(session, url, bodies[i], outcomes[i], t0, timeout)

        tasks = {asyncio.create_task(one(i)): i for i, r in enumerate(specs)
                 if r.arrival_s < deadline}
        pending: set = set()
        if tasks:
            wait = None if time_limit is None else max(0.0, t0 + time_limit - time.perf_counter())
            _, pending = await asyncio.wait(tasks, timeout=wait)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        for task in pending:   # sent, but still streaming at the time limit
            o = outcomes[tasks[task]]
            o.error = o.error or f"time limit: cancelled after {o.num_tokens} tokens"
        wall = time.perf_counter() - t0
    sent = [o for o in outcomes if not math.isnan(o.sent_s)]
    not_sent = len(specs) - len(sent)
    meta = {
        "endpoint": endpoint, "model": model, "engine_version": info["engine_version"],
        "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "wall_s": wall,
        "load_average_before": load_before, "load_average_after": load_average(),
        "num_scheduled": len(specs), "num_not_sent": not_sent, "timeout_s": timeout,
        "time_limit_s": time_limit, "warmup_requests": warmup,
        # time.perf_counter() at the replay's 0: lines its times up with another process's
        # monotonic clock (simserve serve --record writes its own)
        "clock_origin_s": t0,
    }
    requests, chunks = _tables(sent)
    summary = _summary(s, requests, chunks)
    summary.update(source="replay", endpoint=endpoint, engine_version=info["engine_version"],
                   num_not_sent=not_sent)
    return ReplayResult(s, requests, chunks, summary, meta)


def _tables(outcomes: list[Outcome]) -> tuple[pd.DataFrame, pd.DataFrame]:
    import pandas as pd

    from simserve.metrics.summary import tpot
    from simserve.runner import REQUEST_COLUMNS
    nan = math.nan
    rows = []
    for o in outcomes:
        ok = o.ok
        first = o.chunk_times[0] if ok else nan
        finish = o.chunk_times[-1] if ok else nan
        n = o.num_tokens
        error = o.error
        if ok and o.usage_output_tokens is not None and o.usage_output_tokens != n:
            error = f"token count {n} but usage says {o.usage_output_tokens}"
        elif ok and n != o.spec.num_output_tokens:
            error = f"token count {n} but {o.spec.num_output_tokens} were asked for"
        ttft, e2el = first - o.sent_s, finish - o.sent_s
        rows.append({
            "request_id": o.spec.request_id, "replica": 0, "arrival_s": o.sent_s,
            "num_prompt_tokens": o.spec.num_prompt_tokens,
            "num_output_tokens": n if ok else o.spec.num_output_tokens,
            "status": "finished" if ok else "failed", "reject_reason": "",
            "first_scheduled_s": nan, "first_token_s": first, "finish_s": finish,
            "num_preemptions": 0, "ttft_s": ttft, "e2el_s": e2el,
            "tpot_s": nan,               # (below: metrics.summary.tpot)
            "priority": o.spec.priority, "class": o.spec.klass,
            "num_cached_tokens": o.cached_tokens,
            "scheduled_s": o.spec.arrival_s, "num_chunks": len(o.chunk_times),
            "usage_output_tokens": o.usage_output_tokens, "http_status": o.http_status,
            "error": error,
        })
    requests = pd.DataFrame(rows, columns=[*REQUEST_COLUMNS, *REPLAY_COLUMNS])
    requests["tpot_s"] = tpot(requests["ttft_s"].to_numpy(float),
                              requests["e2el_s"].to_numpy(float),
                              requests["num_output_tokens"].to_numpy(),
                              (requests["status"] == "finished").to_numpy())
    requests["usage_output_tokens"] = requests["usage_output_tokens"].astype("Int64")
    requests["http_status"] = requests["http_status"].astype("Int64")
    chunk_rows = [(o.spec.request_id, k, t, n) for o in outcomes if o.ok
                  for k, (t, n) in enumerate(zip(o.chunk_times, o.chunk_tokens))]
    chunks = pd.DataFrame(chunk_rows, columns=list(CHUNK_COLUMNS))
    return requests, chunks


def _summary(s: Scenario, requests: pd.DataFrame, chunks: pd.DataFrame) -> dict:
    """``summarize`` with vllm bench's ITL (one gap per chunk), plus the failures."""
    import numpy as np
    import pandas as pd

    from simserve.metrics.recorder import STEP_COLUMNS
    from simserve.metrics.summary import WeightedSample, summarize
    from simserve.runner import class_slos
    gaps = [np.diff(g.to_numpy(float)) for _, g in chunks.groupby("request_id")["time_s"]]
    values = np.concatenate(gaps) if gaps else np.empty(0)
    itl = WeightedSample(values, np.ones(len(values), dtype=np.int64))
    steps = pd.DataFrame({c: pd.Series(dtype=float) for c in STEP_COLUMNS})
    has_classes = bool((requests["class"].astype(str) != "").any())
    summary = summarize(requests, None, steps, s.slo, itl=itl,
                        class_slos=class_slos(s) if has_classes else None)
    failed = requests[requests["status"] == "failed"]
    kinds: dict[str, int] = {}
    for err in failed["error"]:
        key = _error_kind(str(err))
        kinds[key] = kinds.get(key, 0) + 1
    summary["num_failed"] = len(failed)
    summary["failed_by_error"] = dict(sorted(kinds.items()))
    summary["token_count_mismatches"] = int(
        ((requests["status"] == "finished") & (requests["error"] != "")).sum())
    summary["total_chunks"] = len(chunks)
    # how late requests went out: a busy client machine shows here first (it delays sends and
    # the reading of chunks alike, which no server model explains)
    lag = (requests["arrival_s"] - requests["scheduled_s"]).to_numpy(float) * 1000.0
    summary["send_lag_p50_ms"] = float(np.percentile(lag, 50)) if len(lag) else 0.0
    summary["send_lag_p99_ms"] = float(np.percentile(lag, 99)) if len(lag) else 0.0
    return summary


def _error_kind(error: str) -> str:
    """A short class of an error message, for the summary's counts."""
    if error.startswith("HTTP "):
        return error.split(":")[0]
    if error.startswith("timeout"):
        return "timeout"
    if error.startswith("time limit") or error.startswith("not sent"):
        return "time limit"
    return error.split(":")[0]


# --------------------------------------------------------------------------------------------
# Command line


def register(subparsers) -> None:
    p = subparsers.add_parser("replay", help="send a scenario's workload to a live "
                                             "OpenAI-compatible server and record it")
    p.add_argument("scenario", help="scenario YAML file (its workload is replayed)")
    p.add_argument("--endpoint", required=True,
                   help="the server's root URL, e.g. http://127.0.0.1:8011 (an OpenAI base "
                        "URL ending in /v1 is read as its root)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--model", help="model name to request (default: the first of /v1/models)")
    p.add_argument("--max-requests", type=int, metavar="N", help="send at most the first N")
    p.add_argument("--time-limit", type=float, metavar="S",
                   help="wall-clock limit in seconds: nothing is sent after it; requests still "
                        "in flight are cancelled and recorded as failed")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="per-request timeout in seconds (default 300)")
    p.add_argument("--warmup", type=int, default=2, metavar="N",
                   help="short unrecorded requests sent first (default 2)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="FIELD=VALUE", help="override a scenario field (repeatable)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback endpoint host")
    p.add_argument("--quiet", action="store_true", help="do not print the summary table")
    p.set_defaults(handler=_cmd_replay)


def _cmd_replay(args) -> int:
    import sys
    from simserve.runner import scenario_file_inputs
    inputs = scenario_file_inputs(args.scenario, args.overrides)
    check_out_dir(args.out, (*OUTPUT_FILES["replay"], *REPORT_FILES), inputs)
    # (before the replay: a real run cannot be had again)
    earlier = Path(args.out)
    if (earlier / "replay.json").is_file() or (earlier / "summary.json").is_file():
        # (said first: a replay of a real server cannot be had again once overwritten)
        print(f"note: replacing the results already in {earlier}/ (give --out another folder "
              f"to keep them)", file=sys.stderr)
    result = replay(args.scenario, args.endpoint, model=args.model,
                    max_requests=args.max_requests, time_limit=args.time_limit,
                    timeout=args.timeout, warmup=args.warmup, allow_remote=args.allow_remote,
                    overrides=args.overrides, log=lambda line: print(line, file=sys.stderr))
    if not args.quiet:
        print(result.table())
    sm = result.summary
    if sm["num_failed"]:
        kinds = ", ".join(f"{k}: {v}" for k, v in sm["failed_by_error"].items())
        print(f"failed requests: {sm['num_failed']} ({kinds})", file=sys.stderr)
    if sm["token_count_mismatches"]:
        print(f"warning: {sm['token_count_mismatches']} requests' token counts differ from "
              f"the server's usage", file=sys.stderr)
    note = clear_other_outputs(Path(args.out), "replay", inputs=inputs)
    if note:
        print(f"note: {note}", file=sys.stderr)
    path = result.save(args.out)
    print(f"replayed {sm['num_requests']} requests in {result.meta['wall_s']:.1f} s "
          f"({sm['completed']} finished, {sm['num_failed']} failed); results in {path}/")
    return 0
