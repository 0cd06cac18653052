"""Write the notebooks of this folder from the cells below, executed, with their outputs.

    .venv/bin/python notebooks/make_notebooks.py

Edit the cells here, not the .ipynb files, and run this again: it executes each notebook
(nbclient, the python3 kernel) and saves it with its outputs, so they read on a code host without
running anything. Every number comes from a seeded simulation, so running it again gives the
same outputs. tests/integration/test_notebooks.py executes every notebook again and checks that
the saved outputs are what the code gives today. It needs nbclient, nbformat and ipykernel (the
dev extras that ``make test`` installs).
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbclient
import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

COMPARE = [
    new_markdown_cell("""\
# Comparing scheduling policies

This notebook runs one workload — Llama-3.1-8B on one H100, with request lengths like Azure's
conversation trace — under five of simserve's scheduling policies (docs/policies.md lists them
all), and compares them: first at one load, then across loads, to find where each policy stops
meeting its latency SLOs.

Everything here uses simserve's Python API; every result is a pandas DataFrame. The workloads are
kept small (300 requests) so the whole notebook runs in seconds. Step times come from a roofline
*estimate* of the H100, so read the numbers as relative, not as a measurement.

Run it from this folder (`notebooks/`): the scenario paths below are relative to it.
`styled(df)` shows a DataFrame with readable numbers (11,150 rather than 1.115e+04); the data
itself keeps full precision."""),
    new_code_cell("""\
%matplotlib inline
import simserve
from simserve.fmt import styled
from simserve.runner import coinciding, comparison_table
from simserve.report import (RunData, latency_cdfs, latency_vs_load, load_curves, policy_bars,
                             throughput_vs_load, timeline)"""),
    new_markdown_cell("""\
## One load, five policies

`scenarios/compare_policies.yaml` is the quickstart scenario with a `compare:` section listing
the policies, each at its own system's or paper's knobs: vLLM's 8192-token budget, and
Sarathi-Serve's 512 tokens for `sarathi` (at the same budget it would schedule exactly as
`vllm_v1` does: docs/policies.md, "When policies coincide"). `simserve.compare` runs one variant
per entry and returns `{label: Result}`. `overrides` change any scenario field, as `--set` does
on the command line."""),
    new_code_cell("""\
results = simserve.compare("../scenarios/compare_policies.yaml",
                           overrides=["workload.num_requests=300"])
styled(comparison_table(results))"""),
    new_markdown_cell("""\
Each row is one policy. *Goodput* counts only requests that met every SLO (here TTFT ≤ 500 ms and
TPOT ≤ 50 ms); *SLO attainment* is the share of all requests that did (a percentage in every
table, a fraction in the data). `static` batching waits
for a whole batch to finish before admitting new requests, so its time to first token explodes.
`orca` and `vllm_v1` differ by little at this load (their mean TTFTs by under 1 %): with ample
KV cache both admit whatever arrives at the next iteration, beside the running decodes. They part
when the cache is tight (`orca` reserves a request's whole output at admission and never
preempts) or a prompt exceeds the token budget (`orca` runs it whole, `vllm_v1` in chunks):
docs/policies.md.

The distributions say more than percentiles. The report module's figure functions take
`RunData` records, which `RunData.from_result` makes from in-memory results."""),
    new_code_cell("""\
runs = [RunData.from_result(label, result) for label, result in results.items()]
latency_cdfs(runs)"""),
    new_code_cell("policy_bars(runs)"),
    new_markdown_cell("""\
A timeline shows what the scheduler did over the run: requests running and waiting, tokens per
second split into prefill and decode, KV-cache blocks in use, and preemptions. Each result's
`steps` DataFrame (one row per engine iteration) holds the raw data."""),
    new_code_cell("""\
timeline(runs[3])   # vllm_v1"""),
    new_code_cell("""\
styled(results["vllm_v1"].steps.head())"""),
    new_markdown_cell("""\
Were any two policies' schedules identical — every step the same? `coinciding` answers: none
above; but `sarathi` at vLLM's 8192-token budget schedules exactly as `vllm_v1` does (the KV
capacity aside: `vllm_v1` keeps one null block back):"""),
    new_code_cell("""\
at_8192 = {policy: simserve.run("../scenarios/quickstart.yaml",
                                overrides=["workload.num_requests=300",
                                           f"scheduler.policy={policy}"])
           for policy in ("vllm_v1", "sarathi")}
coinciding(results), coinciding(at_8192)"""),
    new_markdown_cell("""\
## Across loads: where does each policy break?

One load point hides the interesting part. `simserve.sweep` runs a grid of variants — here four
request rates × three policies, each policy at its own token budget (`zip` advances its lists
together) — in parallel processes, and returns one row per point with every summary metric.
`fixed` sets fields for every point."""),
    new_code_cell("""\
table = simserve.sweep("../scenarios/quickstart.yaml",
                       grid={"workload.rate": [6, 10, 14, 18]},
                       zip={"scheduler.policy": ["vllm_v0", "vllm_v1", "sarathi"],
                            "engine.max_num_batched_tokens": [8192, 8192, 512]},
                       fixed={"workload.num_requests": 300})
styled(table[["scheduler.policy", "engine.max_num_batched_tokens", "workload.rate",
              "request_throughput", "request_goodput", "slo_attainment", "p99_ttft_ms",
              "p99_tpot_ms"]])"""),
    new_markdown_cell("""\
`load_curves` groups the table into one curve per policy. The top panel shows served throughput
(solid) and goodput (dashed) against offered load; the bottom panel shows SLO attainment against
the 90% target. The *knee* is the highest load at which every lower load meets the target.
Sarathi-Serve's small budget buys the lowest TPOT at the price of TTFT, which is what its
attainment curve shows."""),
    new_code_cell("""\
curves = load_curves(table, "workload.rate", ["scheduler.policy"])
throughput_vs_load(curves, target=0.9)"""),
    new_code_cell("""\
latency_vs_load(curves, slo={"ttft_ms": 500, "tpot_ms": 50})"""),
    new_code_cell("""\
{curve.label: curve.knee(0.9) for curve in curves}"""),
    new_markdown_cell("""\
## Next steps

- Make the grid finer, or use more requests, for a sharper knee (the capacity-planning notebook
  finds it by bisection instead).
- Sweep engine knobs too, e.g. `"engine.max_num_batched_tokens": [512, 2048, 8192]`.
- From the command line, `simserve sweep grid.yaml` runs the same grid and writes `sweep.csv` with
  an HTML report; `--executor ray` runs it on a Ray cluster."""),
]

CAPACITY = [
    new_markdown_cell("""\
# Capacity planning

Before deploying, we want two numbers:

1. the highest request rate one deployment serves while meeting its SLOs, and
2. how many replicas a target rate needs.

simserve answers with DistServe's definition of goodput: the largest arrival rate at which at
least a target fraction of requests (here 90%) meets every latency SLO. It finds that rate by
simulation: double the rate until the target is missed, then bisect, repeating seeds near the
knee. This notebook plans Llama-3.1-8B on H100s (roofline step-time *estimates*) with small
workloads so it runs in seconds; use more requests and seeds for real planning.

Run it from this folder (`notebooks/`)."""),
    new_code_cell("""\
%matplotlib inline
import pandas as pd
import simserve
from simserve.fmt import styled
from simserve.report import CapacityData, capacity_attainment"""),
    new_markdown_cell("""\
## The scenario and its SLO

The quickstart scenario: one H100, vLLM v1's scheduler, lengths like Azure's conversation trace.
Its `slo:` section sets the limits and the attainment target. We keep 300 requests per run; the
request count stays fixed while the search moves the rate."""),
    new_code_cell("""\
scenario = simserve.load_scenario("../scenarios/quickstart.yaml",
                                  overrides=["workload.num_requests=300"])
scenario.slo"""),
    new_markdown_cell("""\
## Highest rate meeting the SLO, and replicas for a target

`simserve.capacity` returns the answer with every run behind it. `seeds=2` runs two arrival and
length draws per probe near the knee; a rate passes only if *every* seed meets the target (the
minimum over seeds), and the spread across seeds is reported. With `target_rate`, it also finds
the fewest replicas serving that rate."""),
    new_code_cell("""\
cap = simserve.capacity(scenario, seeds=2, tolerance=0.1, target_rate=40)
print(cap.table())"""),
    new_markdown_cell("""\
`cap.probes` holds one row per simulated run: the search phase, the rate, the replica count,
the seed, and the metrics that decided it."""),
    new_code_cell("""\
styled(cap.probes[["phase", "rate", "replicas", "seed", "slo_attainment", "request_goodput",
                   "p99_ttft_ms", "p99_tpot_ms"]])"""),
    new_code_cell("""\
capacity_attainment(CapacityData.from_result(cap))"""),
    new_markdown_cell("""\
## What moves the answer

Capacity depends on the SLO as much as on the hardware, and only on the limit that binds. The
same search over three TTFT limits under two TPOT limits (one seed each, to keep it quick):"""),
    new_code_cell("""\
rows = []
for tpot_ms in (50, 100):
    for ttft_ms in (250, 500, 1000):
        s = simserve.load_scenario("../scenarios/quickstart.yaml",
                                   overrides=["workload.num_requests=300",
                                              f"slo.ttft_ms={ttft_ms}", f"slo.tpot_ms={tpot_ms}"])
        c = simserve.capacity(s, seeds=1, tolerance=0.05)
        rows.append({"TPOT SLO (ms)": tpot_ms, "TTFT SLO (ms)": ttft_ms,
                     "max rate (req/s)": c.max_rate})
styled(pd.DataFrame(rows).pivot(index="TTFT SLO (ms)", columns="TPOT SLO (ms)",
                                values="max rate (req/s)"))"""),
    new_markdown_cell("""\
Read it by column. Under TPOT ≤ 50 ms, loosening TTFT from 250 to 500 ms buys rate, but 500 to
1000 ms buys none: past that point TPOT is the limit that fails first (the probe table above
shows p99 TPOT past 50 ms at 16.8 req/s, seed 0, while p99 TTFT is still under 500 ms). Under
TPOT ≤ 100 ms the looser TTFT limits pay off all the way. Planning against one SLO at a time
would miss this."""),
    new_markdown_cell("""\
Tensor parallelism is the other lever: two GPUs per replica run each step faster, but the per-GPU
rate is what the bill follows. `per_gpu_rate` divides by replicas × `tensor_parallel_size`."""),
    new_code_cell("""\
rows = []
for tp in (1, 2):
    s = simserve.load_scenario("../scenarios/quickstart.yaml",
                               overrides=["workload.num_requests=300",
                                          f"engine.tensor_parallel_size={tp}"])
    c = simserve.capacity(s, seeds=1, tolerance=0.1)
    rows.append({"tensor parallel": tp, "GPUs": c.gpus, "max rate (req/s)": c.max_rate,
                 "per GPU (req/s)": c.per_gpu_rate})
styled(pd.DataFrame(rows))"""),
    new_markdown_cell("""\
## Caveats

- The search assumes attainment falls as the rate grows; the probe table shows whether it did.
- The answer is the highest rate *seen to pass*; the true knee lies below the first failing rate,
  within the tolerance.
- Few requests make a noisy answer: with 300 requests a few unlucky ones move attainment by a
  percent. Raise `num_requests` and `seeds` for decisions.
- From the command line: `simserve capacity scenarios/quickstart.yaml --target-rate 40` prints
  this table for the scenario's own 1,000 requests, 3 seeds and 5 % tolerance (so its numbers
  differ from the 300-request, 2-seed search here: docs/capacity.md shows its output) and
  writes a report with these figures."""),
]


PLAN = [
    new_markdown_cell("""\
# Planning a deployment

`simserve.plan` answers the planner's question: for this model, workload, rate and SLOs, which
GPU type, which tensor parallelism, colocated or disaggregated prefill/decode, which engine
knobs, how many replicas — and what does it cost? It enumerates the deployments, rules out
with cheap bounds those that cannot start or cannot win, and runs the capacity search (the
engine's own schedule, simulated) on the rest.

Here: Llama-3.1-8B under the quickstart load (150 requests a probe to stay fast), 20 req/s,
across three GPU types. Prices per GPU-hour are the shipped assumptions
(`simserve/data/prices.yaml`, each with its source and date); pass your own in `prices`.
Step times are roofline *estimates*. Run it from this folder (`notebooks/`)."""),
    new_code_cell("""\
%matplotlib inline
import tempfile
import pandas as pd
import simserve
from simserve.fmt import styled
from simserve.report import PlanData, plan_pareto"""),
    new_code_cell("""\
scenario = simserve.load_scenario("../scenarios/quickstart.yaml",
                                  overrides=["workload.num_requests=150"])
space = {
    "hardware": ["H100-SXM", "A100-80GB", "L40S"],
    "tensor_parallel_size": [1, 2],
    "disaggregation": ["colocated", "1:1"],
    "max_num_batched_tokens": [2048, 8192],
    "runners_up": 2,
}
result = simserve.plan(scenario, target_rate=20, space=space, workers=1)
print(result.answer())"""),
    new_markdown_cell("""\
`result.table` has one row per candidate: its deployment, and either the bound that pruned it
(`pruned_by`, `reason`) or what its capacity search found (max rate per copy, replicas for the
target, GPUs, cost per hour and per million output tokens, throughput per GPU and tokens/s per
user at its max rate). Saved, it is `candidates.csv` (and `.parquet` with pyarrow)."""),
    new_code_cell("""\
out = result.save(tempfile.mkdtemp())
table = pd.read_csv(out / "candidates.csv")
styled(table[table["status"] == "serves target"].sort_values("cost_per_hour")[
    ["deployment", "max_num_batched_tokens", "replicas", "gpus", "cost_per_hour",
     "cost_per_million_output_tokens", "output_tokens_per_s_per_gpu",
     "tokens_per_s_per_user"]].head(6))"""),
    new_code_cell("""\
table["pruned_by"].value_counts()"""),
    new_markdown_cell("""\
The Pareto frontier of throughput per GPU against tokens/s per user (the chart AIConfigurator
and InferenceMAX publish), each point a deployment at its own max rate; the ring is the
cheapest deployment for the target rate. Candidates that cost the same per hour are ranked by
the higher max rate per GPU (docs/capacity.md), not by cost per token: so the pick may sit a
hair off the frontier beside a runner-up of the same price."""),
    new_code_cell("""\
plan_pareto(PlanData.from_result(result))"""),
    new_markdown_cell("""\
From the command line: `simserve plan SCENARIO --target-rate 20` with the space in the
scenario's `plan:` section (or `--plan FILE`) prints the same answer, the winner's `vllm serve`
line, and writes the table and an HTML report."""),
]


def build(cells: list, name: str):
    """The notebook of ``cells``, without outputs."""
    for i, cell in enumerate(cells):
        cell.id = f"{Path(name).stem}-{i:02d}"     # stable ids: regenerating gives no diff
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })
    nbformat.validate(nb)
    return nb


def execute(nb, folder: Path = HERE):
    """Run every cell in ``folder`` (the notebooks' paths are relative to it), in place."""
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     record_timing=False,   # no wall-clock times in the file
                                     resources={"metadata": {"path": str(folder)}})
    client.execute()
    nb.metadata.pop("widgets", None)
    nb.metadata["language_info"] = {"name": "python"}   # not the kernel's exact version
    return nb


def write(cells: list, name: str, folder: Path = HERE) -> Path:
    nb = execute(build(copy.deepcopy(cells), name))
    path = folder / name
    nbformat.write(nb, path)
    return path


NOTEBOOKS = {"compare_policies.ipynb": COMPARE, "capacity_planning.ipynb": CAPACITY,
             "plan_deployment.ipynb": PLAN}

if __name__ == "__main__":
    for name, cells in NOTEBOOKS.items():
        print(write(cells, name))
