"""The deployment layer: an experiment's engines, built once and run by one loop.

:func:`~batchsim.deployment.assembly.assemble` turns a validated experiment into a
:class:`~batchsim.deployment.base.Deployment` — one engine, replicas behind a router, or
prefill and decode pools — and :meth:`~batchsim.deployment.base.Deployment.run` simulates it
on a workload's requests, leaving the records the run's tables and summary are made of
(:class:`~batchsim.deployment.base.DeploymentRun`). Everything that runs an experiment goes
through here (:func:`batchsim.simulation.simulate`, and with it ``batchsim run``, sweeps,
capacity searches and calibration; ``batchsim validate`` assembles without running).

- :mod:`.setup`: what one engine is built from (catalogs, cost model, KV-cache size);
- :mod:`.engines`: one engine made from its setup (KV cache, policy, settings);
- :mod:`.base`: what every deployment is and leaves;
- :mod:`.single`, :mod:`.replicas`, :mod:`.disaggregated`: the three kinds;
- :mod:`.assembly`: which kind an experiment is, and its groups built.
"""

from batchsim.deployment.assembly import assemble
from batchsim.deployment.base import Deployment, DeploymentRun, Group
from batchsim.deployment.setup import Setup, engine_setup

__all__ = ["Deployment", "DeploymentRun", "Group", "Setup", "assemble", "engine_setup"]
