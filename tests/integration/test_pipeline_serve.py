"""``simserve serve`` runs a pipeline-parallel replica with its micro-batches in flight: the live
schedule equals ``simserve run`` of the arrivals it saw (tests/integration/test_serve.py's check,
with ``engine.pipeline_parallel_size: 2``)."""

from __future__ import annotations

import numpy as np

from simserve.config import load_scenario
from tests.integration.test_serve import SCENARIO, live_and_offline, write_scenario

PP = SCENARIO.replace("engine: {", "engine: {pipeline_parallel_size: 2, ")


def test_pipelined_live_schedule_equals_simserve_run(tmp_path):
    from simserve.runner import run

    assert load_scenario(write_scenario(tmp_path, PP)).engine.pipeline_parallel_size == 2
    served, offline = live_and_offline(tmp_path, PP)
    np.testing.assert_allclose(served["first_token_s"], offline["first_token_s"], rtol=0,
                               atol=1e-9)
    np.testing.assert_allclose(served["finish_s"], offline["finish_s"], rtol=0, atol=1e-9)
    # and the pipeline is not the synchronous engine: the same arrivals without PP differ
    flat = load_scenario(write_scenario(tmp_path, SCENARIO.split("workload:")[0] + (
        f"workload: {{trace: {tmp_path / 'rec' / 'trace.csv'}, format: csv}}\n"), "f.yaml"))
    assert not np.allclose(run(flat).requests.sort_values("request_id")["finish_s"],
                           offline["finish_s"])
