"""Cluster figures of a run: per-replica throughput and busy time, load imbalance, retries,
failures and KV transfers (docs/cluster.md, "Per-replica figures")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from simserve.metrics.levels import replica_chunks
from simserve.metrics.summary import Table, column, grouped_levels

if TYPE_CHECKING:
    from simserve.metrics.recorder import Recorder


def replica_summary(requests: Table, logs: dict[int, Any], replicas: Sequence[Any],
                    t0: float, t1: float) -> dict[str, Any]:
    """Per-replica table and load-imbalance figures (docs/cluster.md, "Per-replica figures").

    ``logs`` maps a replica index to its grouped step columns (what ``grouped_levels``
    takes). Imbalance is max/mean and the coefficient of variation (population std / mean) of
    completed requests and of busy time over the replicas that finish requests (mixed or
    decode), and of busy time over the prefill pool when there is one.
    """
    width = t1 - t0
    finished = np.asarray(column(requests, "status") == "finished", dtype=bool)
    where = column(requests, "replica")
    rows = []
    for r in replicas:
        g = logs.get(r.index)
        busy, steps, running, kv = 0.0, 0, 0.0, 0.0
        if g is not None and (len(g["start_s"]) or g.get("folded")):
            for c in replica_chunks(g, t0, t1):     # (summed chunk by chunk, as the levels)
                busy += c.busy
                steps += c.num_steps
            levels = grouped_levels([g], t0, t1)
            running, kv = levels["mean_running"], levels["mean_kv_utilization"]
        done = int((finished & (where == r.index)).sum())
        rows.append({"replica": r.index, "group": r.group, "role": r.role, "completed": done,
                     "request_throughput": done / width if width > 0 else 0.0,
                     "busy_s": busy, "busy_fraction": busy / width if width > 0 else 0.0,
                     "num_steps": steps, "mean_running": running, "mean_kv_utilization": kv})
    out: dict[str, Any] = {"per_replica": rows}
    serving = [row for row in rows if row["role"] != "prefill"]
    out.update(_imbalance("completed", [row["completed"] for row in serving]))
    out.update(_imbalance("busy", [row["busy_s"] for row in serving]))
    prefill = [row["busy_s"] for row in rows if row["role"] == "prefill"]
    if prefill:
        out.update({f"prefill_{k}": v for k, v in _imbalance("busy", prefill).items()})
    return out


def _imbalance(name: str, values: list[float]) -> dict[str, Any]:
    x = np.asarray(values, dtype=float)
    mean = float(x.mean()) if len(x) else 0.0
    if mean <= 0:
        return {f"load_imbalance_{name}": None, f"cv_{name}": None}
    return {f"load_imbalance_{name}": float(x.max()) / mean, f"cv_{name}": float(x.std()) / mean}


def cluster_summary(rec: Recorder, replicas: Sequence[Any],
                    requests: Table) -> dict[str, Any]:
    """Cluster figures for the summary: retries and replica failures always; KV transfers for
    a disaggregated cluster; the per-replica table and load imbalance with several replicas."""
    out: dict[str, Any] = {"num_retries": int(sum(rec.retries.values())),
                           "num_retried_requests": len(rec.retries),
                           "num_replica_failures": len(rec.failures)}
    if rec.transfer_s:
        x = np.asarray(rec.transfer_s)
        out.update(num_kv_transfers=len(x), mean_kv_transfer_ms=float(x.mean()) * 1e3,
                   max_kv_transfer_ms=float(x.max()) * 1e3)
    if len(replicas) > 1:
        finished = np.asarray(column(requests, "status") == "finished", dtype=bool)
        t0 = float(np.nanmin(column(requests, "arrival_s", float))) if len(finished) else 0.0
        t1 = float(column(requests, "finish_s")[finished].max()) if finished.any() else t0
        logs = {i: log.level_columns() for i, log in rec.replicas.items()}
        out.update(replica_summary(requests, logs, replicas, t0, t1))
    return out
