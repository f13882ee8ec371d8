"""The one place an experiment becomes a deployment: :func:`assemble`.

``batchsim run``, sweeps and capacity searches, calibration, ``batchsim validate`` (and the
planner and the server to come) all assemble their deployments here, so that every feature
of an experiment means the same wherever it runs. Which kind of deployment an experiment is
follows from its blocks alone:

- no ``cluster:`` — one engine (:class:`~batchsim.deployment.single.OneEngine`);
- ``cluster: {replicas: ...}`` — replicas behind a router
  (:class:`~batchsim.deployment.replicas.Replicas`);
- ``cluster: {disaggregation: ...}`` — prefill and decode pools
  (:class:`~batchsim.deployment.disaggregated.Disaggregated`).

Each group of alike engines is built once (:func:`~batchsim.deployment.setup.engine_setup`);
a bad group is one line naming it (``cluster.replicas[1]: ...``).
"""

from __future__ import annotations

from batchsim.catalog.hardware import HardwareProfile
from batchsim.catalog.model_files import load_model
from batchsim.config.experiment import ExperimentConfig
from batchsim.config.groups import group_experiments
from batchsim.deployment.base import Deployment, Group
from batchsim.deployment.disaggregated import Disaggregated
from batchsim.deployment.replicas import Replicas
from batchsim.deployment.setup import engine_setup
from batchsim.deployment.single import OneEngine
from batchsim.errors import ConfigError

POOLS = ("prefill", "decode")
"""The pools of a disaggregated cluster, in the order of their engines."""


def assemble(config: ExperimentConfig, hardware: HardwareProfile | None = None) -> Deployment:
    """The deployment of ``config``, built (catalogs loaded, cost models made, KV caches
    sized) and ready to run.

    Args:
        config: A validated experiment.
        hardware: Use this profile instead of loading ``config.hardware`` (one engine only:
            ``batchsim calibrate`` simulates candidate profiles that exist only in memory).

    Raises:
        ConfigError: Something in the experiment cannot be built; nothing has run.
    """
    cluster = config.cluster
    if cluster is None:
        model = load_model(config.model)
        return OneEngine(config, [Group(1, config, engine_setup(config, hardware))], model)
    if hardware is not None:
        raise ConfigError("simulate(hardware=...) applies to one engine, not a cluster:")
    pooled = cluster.disaggregation is not None
    groups = []
    for i, (count, experiment) in enumerate(group_experiments(config)):
        try:
            setup = engine_setup(experiment)
        except ConfigError as exc:
            if isinstance(cluster.replicas, int):
                raise
            raise ConfigError(f"{cluster.group_key(i)}: {exc.message}") from None
        groups.append(Group(count, experiment, setup, POOLS[i] if pooled else None))
    model = load_model(config.model)
    if pooled:
        deployment = Disaggregated(config, groups, model)
        deployment.transfer()  # the pools' KV dtypes agree
        return deployment
    return Replicas(config, groups, model)
