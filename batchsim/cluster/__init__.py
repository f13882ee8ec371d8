"""Many engines on one SimPy environment: the routers and the runtime of a cluster.

- :mod:`.config`: the ``cluster:`` block (replicas or groups of replicas, router, overhead,
  disaggregated pools);
- :mod:`.router`: the routers, one class each, and ``package.module:Class`` loading;
- :mod:`.dispatch`: the router process, the replicas' inboxes and links, and the
  same-instant rule of a cluster's events;
- :mod:`.plan`: a replica's stretches, priced when they start and logged when they end;
- :mod:`.handoff`: a disaggregated cluster's prefill-to-decode hand-off and KV transfers.

Building a cluster's engines from an experiment and merging their records is
:mod:`batchsim.deployment`'s.
"""

from batchsim.cluster.config import ClusterConfig, ReplicaGroup
from batchsim.cluster.router import ROUTERS, Router, load_router

__all__ = ["ROUTERS", "ClusterConfig", "ReplicaGroup", "Router", "load_router"]
