"""Clusters, as a scenario describes them (SimPy-free; simserve/engine/ runs them): the
``cluster:`` section (replica groups, disaggregated prefill/decode, KV transfer links),
routers, and fault injection."""

from simserve.cluster.config import (LINKS, ROLES, ClusterConfig, GroupConfig, TransferConfig,
                                     groups_of)

__all__ = ["LINKS", "ROLES", "ClusterConfig", "GroupConfig", "TransferConfig", "groups_of"]
