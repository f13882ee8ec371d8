"""Pipeline parallelism: the model's layers split into consecutive stages, each priced alone.

Owns :func:`stage_layers` (how many layers each stage holds), :func:`stage_model` (the part
of a model one stage runs) and :class:`PipelineCostModel`, which prices one batch on every
stage and the activations each stage sends the next.

- **The split** is vLLM's (``get_pp_indices``): ``L // P`` layers per stage, and the
  remainder one layer each to the stages just before the last one (second-to-last, then
  third-to-last, ...), because the last stage also runs the final norm and lm_head.
- **A stage** is priced by a :class:`~batchsim.cost.RooflineCostModel` of the stage's layers:
  the first stage also gathers the embedding, the last one runs the final norm and lm_head
  (over the sampled rows); with tensor parallelism each stage is ``tp`` GPUs with its
  all-reduces.
- **Between stages** every row's hidden state and residual (vLLM's ``IntermediateTensors``
  of a Llama-like model: two ``tokens x hidden_size`` 16-bit tensors) go from each GPU of a
  stage to its peer in the next one, over the hardware's GPU-to-GPU link:
  ``latency + bytes / link_bandwidth`` (:func:`~batchsim.cost.comm.p2p_time`), the ``tp``
  peers in parallel.
- **Memory**: each stage holds its layers' weights (split by ``tp``) and its layers' KV
  cache; :attr:`PipelineCostModel.stages` give both per GPU.

Must not import simpy, nor anything about requests, schedulers or the engine.
"""

from __future__ import annotations

import dataclasses

from batchsim.catalog.hardware import HardwareProfile
from batchsim.catalog.model import ModelSpec
from batchsim.cost.comm import p2p_time
from batchsim.cost.costs import ACT_BYTES, StepCost
from batchsim.cost.model import RooflineCostModel
from batchsim.cost.shapes import BatchShape
from batchsim.errors import ConfigError

__all__ = ["PipelineCostModel", "stage_layers", "stage_model"]

ACTIVATION_TENSORS = 2
"""Tensors of ``tokens x hidden_size`` sent between stages: the hidden states and the
residual."""


def stage_layers(num_layers: int, num_stages: int) -> list[int]:
    """Layers of each stage, first to last (vLLM's split; ``1 <= num_stages <= num_layers``)."""
    assert 1 <= num_stages <= num_layers, "every stage holds at least one layer"
    parts = [num_layers // num_stages] * num_stages
    for i in range(2, num_layers % num_stages + 2):
        parts[-i] += 1
    return parts


def stage_model(model: ModelSpec, first_layer: int, num_layers: int) -> ModelSpec:
    """The spec of layers ``first_layer .. first_layer + num_layers - 1`` of ``model``.

    The dense-MLP layers are the model's first ``num_dense_layers`` (all of a dense model's,
    the leading ones of an MoE model such as DeepSeek's); the sliding-window
    layers of a hybrid model are counted as spread evenly over the layers.
    """
    end = first_layer + num_layers
    dense = max(0, min(end, model.num_dense_layers) - first_layer)
    total = model.num_hidden_layers
    sliding = (
        end * model.num_sliding_layers // total - first_layer * model.num_sliding_layers // total
    )
    return dataclasses.replace(
        model, num_hidden_layers=num_layers, num_dense_layers=dense, num_sliding_layers=sliding
    )


class PipelineCostModel:
    """Prices a batch on each of ``pp`` pipeline stages of ``tp`` GPUs each.

    Args:
        model: Architecture.
        hardware: One GPU (its GPU-to-GPU link carries the activations between stages).
        tp: Tensor-parallel degree of every stage.
        pp: Number of stages, 1 to ``model.num_hidden_layers``.
        dtype: Weight dtype.
        kv_dtype: KV-cache dtype, or ``auto``.
        ideal: Pure datasheet roofline (see :class:`~batchsim.cost.RooflineCostModel`).

    Attributes:
        num_layers: Layers of each stage.
        stages: The cost model of each stage's part of the model.
        link_bandwidth: Achievable GPU-to-GPU B/s per direction.
        link_latency: Fixed time per send, s.
        activation_bytes_per_token: Bytes one row sends to the next stage.

    Raises:
        ConfigError: ``pp`` out of range, or what :class:`RooflineCostModel` rejects.
    """

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareProfile,
        *,
        tp: int = 1,
        pp: int = 2,
        dtype: str = "bf16",
        kv_dtype: str = "auto",
        ideal: bool = False,
    ) -> None:
        if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
            raise ConfigError(
                f"parallel.pipeline_parallel_size must be an integer >= 1, got {pp!r}"
            )
        if pp > model.num_hidden_layers:
            raise ConfigError(
                f"parallel.pipeline_parallel_size must be <= num_hidden_layers="
                f"{model.num_hidden_layers} of {model.name} (a stage holds at least one "
                f"layer), got {pp}"
            )
        self.num_layers = stage_layers(model.num_hidden_layers, pp)
        self.stages: list[RooflineCostModel] = []
        first = 0
        for s, n in enumerate(self.num_layers):
            self.stages.append(
                RooflineCostModel(
                    stage_model(model, first, n),
                    hardware,
                    tp=tp,
                    dtype=dtype,
                    kv_dtype=kv_dtype,
                    ideal=ideal,
                    first_stage=s == 0,
                    last_stage=s == pp - 1,
                )
            )
            first += n
        link = self.stages[0].all_reduce
        self.link_bandwidth = link.link_bandwidth
        self.link_latency = link.latency
        self.activation_bytes_per_token = ACTIVATION_TENSORS * model.hidden_size * ACT_BYTES

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def step_costs(self, shape: BatchShape) -> list[StepCost]:
        """Each stage's :meth:`~batchsim.cost.RooflineCostModel.step_cost` of ``shape``."""
        return [stage.step_cost(shape) for stage in self.stages]

    def transfer_time(self, num_tokens: int) -> float:
        """Time to send the activations of ``num_tokens`` rows to the next stage, s."""
        return float(
            p2p_time(
                num_tokens * self.activation_bytes_per_token,
                self.link_bandwidth,
                self.link_latency,
            )
        )
