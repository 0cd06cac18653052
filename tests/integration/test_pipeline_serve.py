"""``simserve serve`` runs a pipeline-parallel replica with its micro-batches in flight: the live
schedule equals ``simserve run`` of the arrivals it saw (tests/integration/test_serve.py's check,
with ``engine.pipeline_parallel_size: 2``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simserve.config import load_scenario
from tests.integration.test_serve import SCENARIO, run_live, write_scenario

PP = SCENARIO.replace("engine: {", "engine: {pipeline_parallel_size: 2, ")


def test_pipelined_live_schedule_equals_simserve_run(tmp_path):
    from simserve.live.serve import write_record
    from simserve.runner import run

    s = load_scenario(write_scenario(tmp_path, PP))
    assert s.engine.pipeline_parallel_size == 2
    rng = np.random.default_rng(1)
    plan = [(float(rng.exponential(0.02)), int(rng.integers(50, 1500)),
             int(rng.integers(2, 40)), None) for _ in range(30)]
    sim, _, _, _ = run_live(s, plan, record=True)
    write_record(sim.served, tmp_path / "rec")
    replayed = load_scenario(write_scenario(tmp_path, PP.split("workload:")[0] + (
        f"workload: {{trace: {tmp_path / 'rec' / 'trace.csv'}, format: csv}}\n"), "t.yaml"))
    offline = run(replayed).requests.sort_values("request_id")
    served = pd.read_csv(tmp_path / "rec" / "served.csv")
    assert len(served) == len(offline) == 30
    np.testing.assert_allclose(served["first_token_s"], offline["first_token_s"], rtol=0,
                               atol=1e-9)
    np.testing.assert_allclose(served["finish_s"], offline["finish_s"], rtol=0, atol=1e-9)
    # and the pipeline is not the synchronous engine: the same arrivals without PP differ
    flat = load_scenario(write_scenario(tmp_path, SCENARIO.split("workload:")[0] + (
        f"workload: {{trace: {tmp_path / 'rec' / 'trace.csv'}, format: csv}}\n"), "f.yaml"))
    assert not np.allclose(run(flat).requests.sort_values("request_id")["finish_s"],
                           offline["finish_s"])
