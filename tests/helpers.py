"""Factories for hand-stepped scheduler tests (in the manner of vLLM's tests/v1/core), and the
shipped scenarios' runs that the golden and scenario tests share (``shipped_output``)."""

from __future__ import annotations

from pathlib import Path

from simserve.kv.blocks import BlockManager
from simserve.sched import POLICIES, Request, Scheduler, SchedulerLimits, StepPlan
from simserve.workload.spec import RequestSpec


def make_scheduler(policy: str, *, budget: int = 100, max_num_seqs: int = 8, block_size: int = 4,
                   num_blocks: int = 100, chunked: bool = True, threshold: int = 0,
                   mode: str = "recompute", host_blocks: int = 0,
                   pipeline_parallel_size: int = 1,
                   async_scheduling: bool = False) -> Scheduler:
    limits = SchedulerLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                             enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold,
                             preemption_mode=mode, pipeline_parallel_size=pipeline_parallel_size,
                             async_scheduling=async_scheduling)
    return POLICIES[policy](limits, BlockManager(num_blocks, block_size, host_blocks))


def make_request(rid: int, prompt: int, output: int, arrival: float = 0.0) -> Request:
    return Request(RequestSpec(rid, arrival, prompt, output))


def step(sched: Scheduler, t: float = 0.0) -> StepPlan:
    """One iteration: schedule, then apply the plan as if it took no time."""
    plan = sched.schedule()
    sched.complete(plan, t)
    return plan


def tokens(plan: StepPlan) -> dict[int, int]:
    return dict(zip(plan.request_ids, plan.num_new_tokens))


# -- the shipped scenarios' runs, once per test process ---------------------------------------

_SHIPPED: dict[str, Path] = {}


def simserve_quietly(argv: list[str]) -> None:
    """``simserve ARGV`` in process, its console output swallowed; fails with its stderr."""
    import contextlib
    import io

    from simserve.cli import main
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    assert rc == 0, f"simserve {' '.join(argv)} exited {rc}: {err.getvalue()}"


def shipped_output(scenario: Path) -> Path:
    """The folder ``simserve run SCENARIO --no-report --quiet`` writes for a shipped scenario
    file, run once per test process (in a temporary folder removed at exit): the golden hashes
    (golden/test_outputs.py) and each scenario's point (integration/test_scenarios.py) read the
    same run instead of simulating it twice. Treat it as read-only."""
    key = str(Path(scenario).resolve())
    if key not in _SHIPPED:
        import atexit
        import shutil
        import tempfile
        d = Path(tempfile.mkdtemp(prefix="simserve-shipped-"))
        atexit.register(shutil.rmtree, d, ignore_errors=True)
        simserve_quietly(["run", key, "--out", str(d / "result"), "--no-report", "--quiet"])
        _SHIPPED[key] = d / "result"
    return _SHIPPED[key]
