"""Reports: matplotlib figures and one self-contained ``report.html`` from simserve outputs.

    from simserve.report import write_report
    write_report(["runs/compare_policies"])          # → runs/compare_policies/report.html

The figure functions (``simserve.report.figures``) return plain matplotlib Figures, so the same
plots can be shown in Jupyter from in-memory results (``RunData.from_result``).
"""

from simserve.report.build import render, write_report
from simserve.report.figures import capacity_attainment, latency_cdfs, latency_vs_load, \
    load_curves, plan_pareto, policy_bars, throughput_vs_load, timeline
from simserve.report.load import CapacityData, Inputs, PlanData, RunData, SweepData, \
    load_inputs
from simserve.report.style import POLICY_COLORS, policy_color

__all__ = [
    "POLICY_COLORS", "CapacityData", "Inputs", "PlanData", "RunData", "SweepData",
    "capacity_attainment", "latency_cdfs", "latency_vs_load", "load_curves", "load_inputs",
    "plan_pareto", "policy_bars",
    "policy_color", "render", "throughput_vs_load", "timeline", "write_report",
]
