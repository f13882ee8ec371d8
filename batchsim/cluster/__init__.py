"""Many engine replicas behind a router (the ``cluster:`` block).

- :mod:`.config`: the ``cluster:`` block (replicas or groups of replicas, router, overhead);
- :mod:`.router`: the routers, one class each, and ``package.module:Class`` loading;
- :mod:`.replicas`: building the replica engines of a run, running them, and merging their
  records into the cluster's tables.

The SimPy side (the router process, the replicas' inboxes and the same-instant rule) lives in
:mod:`batchsim.engine.dispatch`.
"""

from batchsim.cluster.config import ClusterConfig, ReplicaGroup
from batchsim.cluster.router import ROUTERS, Router, load_router

__all__ = ["ROUTERS", "ClusterConfig", "ReplicaGroup", "Router", "load_router"]
