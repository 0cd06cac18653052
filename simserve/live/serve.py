"""``simserve serve scenario.yaml --host 127.0.0.1 --port 8000``: the scenario's simulated
cluster behind an OpenAI-compatible endpoint (docs/serve.md).

One port serves every replica through the scenario's router; ``--port-per-replica`` gives
replica i its own port (``--port`` + i) for an external router. Only loopback addresses are
bound unless ``--allow-remote``. SIGINT or SIGTERM stops it: the listening sockets close, the
streams in flight are cut, and with ``--record DIR`` what was served is written there.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from simserve.errors import ConfigError, SimserveError
from simserve.live.client import is_loopback

if TYPE_CHECKING:
    import asyncio

    from simserve.config import Scenario

MAX_PORT = 65535


def check_bind(host: str, port: int, num_ports: int, allow_remote: bool) -> None:
    if not allow_remote and not is_loopback(host):
        raise ConfigError("--host", f"{host} is not a loopback address; simserve serve binds "
                                    f"only 127.0.0.1, localhost or ::1 unless --allow-remote "
                                    f"is given")
    if not 0 <= port <= MAX_PORT or (port and port + num_ports - 1 > MAX_PORT):
        raise ConfigError("--port", f"must be 0 (any free port) or a port such that all "
                                    f"{num_ports} fit below {MAX_PORT + 1}, got {port}")


async def serve(scenario: Scenario, host: str, port: int, *, port_per_replica: bool = False,
                text_tokens: str = "chars", served_model_name: str | None = None,
                record: Path | None = None, ready=None,
                stop: asyncio.Event | None = None) -> int:
    """Serve until ``stop`` is set (or SIGINT/SIGTERM); the number of requests submitted.

    ``ready(urls)`` is called once every port listens (``port`` 0 picks free ports)."""
    import asyncio   # (imported where used: `simserve run` never needs it)

    from aiohttp import web

    from simserve.live.driver import WallClockSimulation
    from simserve.live.http import Frontend

    sim = WallClockSimulation(scenario, record=record is not None)
    if served_model_name:
        sim.model_name = served_model_name
    ports = list(range(len(sim.replicas))) if port_per_replica else [None]
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
        except (NotImplementedError, RuntimeError):   # not the main thread (tests)
            pass
    runners, urls = [], []
    try:
        for i, replica in enumerate(ports):
            app = Frontend(sim, replica=replica, text_tokens=text_tokens).app()
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0,
                                   logger=server_logger())
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, host, port + i if port else 0, backlog=1024)
            try:
                await site.start()
            except OSError as e:
                raise SimserveError(f"--port: cannot listen on {host}:{port + i if port else 0}"
                                    f" ({e.strerror or e})") from None
            bound = runner.addresses[-1][1]
            where = f"[{host}]" if ":" in host else host
            urls.append(f"http://{where}:{bound}")
        if ready is not None:
            ready(urls)
        await stop.wait()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        sim.close()                          # wakes every stream in flight: they end now
        for runner in runners:
            await runner.cleanup()
    if record is not None and sim.served is not None:
        write_record(sim.served, record, sim.clock_origin)
    return sim.num_submitted


class _ClientFaults(logging.Filter):
    """aiohttp logs every malformed request it answers with a 400 (a 100 KB request line,
    10,000 headers, a negative Content-Length) and every client that leaves mid-request with a
    full traceback: those are the client's doing, so one line each instead. Anything else (a
    bug in a handler: a 500) keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            what = f"malformed request answered {exc.code}: " + " ".join(
                str(exc.message).split())[:200]
        elif isinstance(exc, ConnectionError):
            what = f"client disconnected ({exc})"
        else:
            return True
        record.msg, record.args = "simserve serve: %s", (what,)
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def server_logger() -> logging.Logger:
    """The logger the HTTP server reports errors to (see :class:`_ClientFaults`)."""
    log = logging.getLogger("simserve.serve")
    if not any(isinstance(f, _ClientFaults) for f in log.filters):
        log.addFilter(_ClientFaults())
    return log


def check_record_dir(out: Path) -> None:
    """``--record DIR`` must be writable before anything is served: a record that cannot be
    written at shutdown would lose every request served. Creates DIR (as the record would)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".simserve-record-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError("--record", f"cannot write into {out} ({e.strerror or e})") from None


def write_record(served, out: Path, clock_origin: float | None = None) -> None:
    """``served.csv`` (every request as the simulation served it), ``trace.csv`` (their
    arrivals as a plain CSV trace: ``simserve run`` of it reproduces the schedule) and
    ``record.json`` (the monotonic clock's reading at simulated 0)."""
    import dataclasses

    import pandas as pd

    from simserve.live.driver import Served
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SimserveError(f"--record: cannot create {out} ({e.strerror})") from None
    rows = sorted(served, key=lambda r: r.request_id)
    df = pd.DataFrame([dataclasses.asdict(r) for r in rows],
                      columns=[f.name for f in dataclasses.fields(Served)])
    df.to_csv(out / "served.csv", index=False, float_format="%.17g")
    trace = pd.DataFrame({"arrival_s": [r.arrival_s for r in rows],
                          "prompt_tokens": [r.num_prompt_tokens for r in rows],
                          "output_tokens": [r.num_output_tokens for r in rows]})
    trace.to_csv(out / "trace.csv", index=False, float_format="%.17g")
    meta = {"num_requests": len(rows), "clock_origin_s": clock_origin,
            "clock": "time.monotonic (CLOCK_MONOTONIC) at the first request's arrival"}
    (out / "record.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------------
# Command line


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a scenario's simulated cluster behind an OpenAI-compatible HTTP "
                      "endpoint, on the wall clock",
        description="Serve a scenario's simulated cluster behind vLLM's OpenAI-compatible API "
                    "(POST /v1/completions and /v1/chat/completions, streamed or not; GET "
                    "/v1/models, /metrics, /health, /version): each request is simulated as "
                    "it arrives and its tokens are sent on the wall clock. A file with "
                    "compare: is refused. Stop with Ctrl-C or SIGTERM (exit status 0); bad "
                    "input is one line and exit status 2. docs/serve.md has the details.")
    p.add_argument("scenario", help="scenario YAML file (cluster, policy, KV, latency model; "
                                    "its workload gives output lengths a request leaves open)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000,
                   help="port (default 8000; 0 picks a free one, printed at start)")
    p.add_argument("--port-per-replica", action="store_true",
                   help="replica i on its own port, --port + i, for an external router "
                        "(instead of the scenario's router behind one port)")
    p.add_argument("--text-tokens", choices=("chars", "words"), default="chars",
                   help="prompt length of a text prompt: chars = ceil(characters / 4) "
                        "(default), words = whitespace-separated words")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="model name in /v1/models and requests (default: the scenario's model)")
    p.add_argument("--record", metavar="DIR",
                   help="at shutdown, write served.csv, trace.csv (the arrivals as a trace "
                        "`simserve run` can replay) and record.json (the clock's origin) "
                        "into DIR")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="FIELD=VALUE", help="override a scenario field (repeatable)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow binding a non-loopback address")
    p.set_defaults(handler=_cmd_serve)


def _cmd_serve(args) -> int:
    from simserve.config import load_scenario
    from simserve.deployment import check

    if args.served_model_name is not None and not args.served_model_name.strip():
        # (it was taken as "not given": the scenario's model name, silently)
        raise SimserveError("--served-model-name: must not be empty")
    scenario = load_scenario(args.scenario, args.overrides)
    check(scenario)
    num_ports = scenario_replicas(scenario) if args.port_per_replica else 1
    check_bind(args.host, args.port, num_ports, args.allow_remote)
    record = Path(args.record) if args.record else None
    if record is not None:
        check_record_dir(record)

    from simserve.engine.build import build_replicas
    replicas = build_replicas(scenario)       # (what a run's line says: which step-time model)
    clock = replicas[0].latency.label
    blocks = replicas[0].scheduler.blocks
    warnings = list(dict.fromkeys(w for r in replicas for w in r.pricing.warnings()))

    def ready(urls: list[str]) -> None:
        # (once serving: a port that cannot be bound stays one line)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        # as vLLM logs it at start-up (what `simserve calibrate --server-log` reads)
        print(f"GPU KV cache size: {blocks.num_blocks * blocks.block_size:,} tokens",
              file=sys.stderr)
        for url in urls:     # (the URL ends the line: scripts read it there)
            print(f"serving {scenario.model.name} ({scenario.name}) on {url}", flush=True)
        print(f"latency: {clock}; stop with Ctrl-C or SIGTERM", file=sys.stderr, flush=True)

    import asyncio
    n = asyncio.run(serve(scenario, args.host, args.port, port_per_replica=args.port_per_replica,
                          text_tokens=args.text_tokens, served_model_name=args.served_model_name,
                          record=record, ready=ready))
    print(f"stopped after {n} requests" + (f"; record in {record}/" if record else ""),
          flush=True)
    return 0


def scenario_replicas(s: Scenario) -> int:
    from simserve.cluster import groups_of
    return sum(g.replicas for g in groups_of(s))
