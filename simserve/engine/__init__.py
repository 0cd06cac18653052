"""The engine: the only package that knows about SimPy (engine/clock.py is the only module
touching its private API). ``simulate`` runs a workload through replicas: one process per
replica (engine/loops.py), the cluster between them (engine/runtime.py)."""

from simserve.cluster.routing import round_robin
from simserve.engine.replica import Replica, Router, rejection_reason
from simserve.engine.simulation import simulate

__all__ = ["Replica", "Router", "rejection_reason", "round_robin", "simulate"]
