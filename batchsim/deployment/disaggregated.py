"""Disaggregated prefill/decode serving (``cluster.disaggregation``): the deployment of two
pools, run together, their records merged.

A prefill pool runs prompts only and a decode pool runs decodes only, each with its own GPU,
tensor parallelism and batching policy (DistServe, Splitwise, Mooncake). A request's prompt and
first token come from a prefill instance (TTFT ends there), its KV cache then moves to a decode
instance over ``kv_transfer.link`` and its other tokens come from there; the move shows up in
its first inter-token gap. How the request travels, waits for KV space and queues on the link
is :mod:`batchsim.cluster.handoff`'s.

Conventions:

- **Bytes.** A transfer moves the KV of the prompt's tokens (the window's last tokens for a
  model with a sliding window on every layer), all layers: ``kv_transfer_bytes`` is tokens x
  the model's KV bytes per token (``2 x layers x KV heads x head dim x dtype bytes``, or MLA's
  latent). A hybrid model's sliding-window layers move only their window's tokens when the
  decode pool keeps its KV per layer group (:func:`~batchsim.deployment.setup.
  hybrid_kv_groups`).
- **Tensor parallelism.** Every GPU has its own link (the ``link``'s bandwidth is one GPU's, one
  direction). The GPUs' shards move at once, so a transfer takes the larger per-GPU shard (of
  the sending or the receiving side: a TP1 decode instance receives everything over its one
  link) over one link's bandwidth, plus its latency.
- **after_prefill**: the transfer starts when the prompt is done (and the decode instance has
  the space and the link is free): ``latency + bytes / bandwidth``.
- **layerwise**: the KV streams layer by layer while the prompt's last iteration computes; only
  ``max(t/L, t - c (L-1)/L)`` of the link time t is left after the prefill ends, c being that
  iteration's GPU time during which the link was free, L the layers
  (:func:`~batchsim.cost.comm.layerwise_exposed_time`); then the latency. It assumes the decode
  instance's blocks were reserved before the prefill began (Splitwise): granted when the decode
  instance takes them at its first iteration boundary after the prompt is done, else (it had
  to wait for KV space) the whole transfer follows as with ``after_prefill``.
- **Link contention**: a prefill instance's transfers use its one outgoing link one at a time
  in the order they became ready (FIFO); transfers from different prefill instances do not
  share a link.

This module imports no simpy.
"""

from __future__ import annotations

import numpy as np

from batchsim.catalog.links import load_link
from batchsim.cluster.config import LinkConfig
from batchsim.cluster.handoff import DisaggregatedDispatcher, KVTransferModel
from batchsim.cluster.router import DECODE_ROUTER_STREAM, make_router
from batchsim.config import ExperimentConfig
from batchsim.deployment.base import IterationStream, OnStep
from batchsim.deployment.engines import engine_parts
from batchsim.deployment.replicas import (
    ClusterRun,
    Replicas,
    replica_records,
    run_engines,
)
from batchsim.deployment.setup import Setup
from batchsim.errors import ConfigError
from batchsim.metrics.requests import RequestLog
from batchsim.scheduler.registry import load_policy
from batchsim.workload.generation import RequestTable

REQUEST_COLUMNS = ["prefill_replica", "decode_replica"]
"""Columns of a disaggregated run's ``requests.csv`` after ``replica``."""
TRANSFER_COLUMNS = ["kv_wait_ms", "kv_transfer_ms", "kv_transfer_bytes"]
"""Columns at the end of a disaggregated run's ``requests.csv``."""


def transfer_model(config: ExperimentConfig, prefill: Setup, decode: Setup) -> KVTransferModel:
    """How long a prompt's KV takes from the prefill pool to the decode pool.

    Raises:
        ConfigError: The pools store KV in different dtypes.
    """
    assert config.cluster is not None and config.cluster.disaggregation is not None
    spec = config.cluster.disaggregation.kv_transfer
    sender, receiver = prefill.cost_model, decode.cost_model
    if sender.kv_dtype != receiver.kv_dtype:
        raise ConfigError(
            f"cluster.disaggregation.decode.engine.kv_cache_dtype: the decode pool stores KV "
            f"as {receiver.kv_dtype}, the prefill pool as {sender.kv_dtype}; a transfer moves "
            "KV as it is: give both pools one KV dtype"
        )
    if isinstance(spec.link, LinkConfig):
        bandwidth, latency = spec.link.bandwidth_gb_s * 1e9, spec.link.latency_us * 1e-6
    else:
        link = load_link(spec.link)
        bandwidth, latency = link.bandwidth, link.latency
    model = prefill.model
    return KVTransferModel(
        bytes_per_token_per_gpu=max(
            sender.kv_bytes_per_token_per_gpu, receiver.kv_bytes_per_token_per_gpu
        ),
        bytes_per_token=model.kv_bytes_per_token(sender.kv_dtype, sender.dtype),
        bandwidth=bandwidth,
        latency=latency,
        layerwise=spec.mode == "layerwise",
        num_layers=model.num_hidden_layers,
        window=model.sliding_window,
        # a decode pool that keeps a hybrid model's KV per layer group takes the window of its
        # sliding-window layers only
        hybrid_window=model.hybrid_sliding_window if decode.hybrid_kv_groups else None,
        window_share=model.num_sliding_layers / model.num_hidden_layers,
    )


class Disaggregated(Replicas):
    """A prefill pool and a decode pool (see the module docstring); built with the pools'
    transfer model checked (:func:`transfer_model`)."""

    def transfer(self) -> KVTransferModel:
        prefill, decode = self.groups
        return transfer_model(self.config, prefill.setup, decode.setup)

    def run(
        self,
        table: RequestTable,
        on_step: OnStep | None = None,
        stream: IterationStream | None = None,
    ) -> ClusterRun:
        config = self.config
        cluster = config.cluster
        assert cluster is not None and cluster.disaggregation is not None
        prefill, decode = self.groups
        num_prefill, num_decode = prefill.count, decode.count
        # every decode instance is alike: one of their schedulers tells whether a request fits
        policy = load_policy(decode.experiment.scheduler.policy)
        _, judge, _ = engine_parts(decode.experiment, decode.setup, policy)
        dispatcher = DisaggregatedDispatcher(
            table,
            make_router(cluster, config.seed, num_replicas=num_prefill),
            make_router(
                cluster,
                config.seed,
                name=cluster.disaggregation.decode_router,
                key="cluster.disaggregation.decode_router",
                num_replicas=num_decode,
                stream=DECODE_ROUTER_STREAM,
            ),
            cluster.router_overhead_ms / 1e3,
            self.transfer(),
            judge.engine_reject_reason,
        )
        members = self.members()
        links = dispatcher.add_pools(
            [(prefill.setup.hardware.name, prefill.experiment.parallel.tensor_parallel_size)]
            * num_prefill,
            [(decode.setup.hardware.name, decode.experiment.parallel.tensor_parallel_size)]
            * num_decode,
        )
        engines, capacity = run_engines(dispatcher, links, members, on_step)
        for engine, link in zip(engines, links):
            engine.check_done()
            kv = engine.scheduler.kv_cache
            assert kv.num_free_blocks == kv.num_blocks, "KV blocks left held after the run"
            handed_off = getattr(link, "num_handed_off", 0)
            left = engine.request_log.num_rows + handed_off
            assert left == engine.num_arrived, "a request never left"
        assert not any(link.pending or link.arrivals for link in dispatcher.decode_links)
        offsets, records = replica_records(engines, members)
        # a handed-off request's first token: its prefill instance's iteration, numbered on
        # across the cluster's log
        first_runs = dispatcher.prefill_iteration.copy()
        moved = first_runs >= 0
        first_runs[moved] += np.asarray(offsets)[dispatcher.prefill_replica[moved]]
        request_log = RequestLog.concatenate(
            [e.request_log for e in engines] + [dispatcher.rejected],
            [*offsets, 0],
            replicas=[*range(len(engines)), -1],
            first_runs=first_runs,
        )
        by_request = {
            "prefill_replica": dispatcher.prefill_replica,
            "decode_replica": dispatcher.decode_replica,
            "kv_wait_ms": dispatcher.kv_wait * 1e3,
            "kv_transfer_ms": dispatcher.kv_transfer * 1e3,
            "kv_transfer_bytes": dispatcher.kv_bytes,
        }
        return self.cluster_run(engines, records, capacity, request_log, by_request)
