"""Step-latency models: each prices a StepPlan in seconds (see base.LatencyModel)."""

from simserve.latency.base import LatencyModel
from simserve.latency.roofline import ConstantLatency, LinearLatency, RooflineModel

__all__ = ["LatencyModel", "RooflineModel", "ConstantLatency", "LinearLatency"]
