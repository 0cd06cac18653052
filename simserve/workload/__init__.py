"""Workloads: what requests arrive when, synthetic or replayed from a trace.

    cfg = WorkloadConfig.from_fields(Fields(raw["workload"], "workload"))
    requests = build_workload(cfg, seed=0, base_dir=scenario_path.parent)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from simserve.workload.config import RequestClass, WorkloadConfig
from simserve.workload.spec import RequestSpec
from simserve.workload.synthetic import generate

__all__ = ["RequestClass", "RequestSpec", "WorkloadConfig", "build_workload"]


def build_workload(cfg: WorkloadConfig, seed: int, base_dir: Path,
                   notes: list[str] | None = None) -> Sequence[RequestSpec]:
    """The requests of ``cfg``, sorted by arrival then id, with ids 0..n-1 in that order (a
    synthetic workload as columns, ``SpecColumns``: a sequence that makes each spec on
    reading; a trace as a list).

    ``seed`` drives synthetic workloads (a trace replay ignores it); relative file paths in
    ``cfg`` are resolved against ``base_dir``, the scenario file's directory. ``notes`` gets
    what a run should warn of (trace rows skipped).
    """
    if cfg.trace is None:
        return generate(cfg, seed, Path(base_dir))
    from simserve.workload.traces import load_trace   # (pandas: paid only by trace runs)
    trace = load_trace(cfg.trace, Path(base_dir))
    if trace.num_skipped:
        note = (f"{cfg.trace.path}: skipped {trace.num_skipped:,} failed requests (zero output "
                f"tokens: BurstGPT's mark of a failure)")
        import logging            # (paid only by the trace runs that skip rows)
        logging.getLogger(__name__).info("%s", note)
        if notes is not None:       # (a run's warnings say it)
            notes.append(note)
    if cfg.classes and not trace.has_priority:   # a class's priority, where the trace has none
        by_name = {c.name: c.priority for c in cfg.classes}
        return [replace(r, priority=by_name[r.klass]) if r.klass in by_name else r
                for r in trace.requests]
    return trace.requests
