"""The ``workload:`` block: :class:`WorkloadConfig` and the workload files that hold one.

Owns the validated config (open loop with an arrival process, closed loop with ``concurrency``
users and a think time, or a trace replay, and the rules about combining them),
:func:`parse_workload` for a mapping and :func:`load_workload` for a built-in name or YAML
file (:class:`WorkloadDefinition`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from batchsim.catalog import resolve
from batchsim.errors import ConfigError
from batchsim.validation import (
    MAX_REQUESTS,
    ConfigModel,
    FieldError,
    StrictInt,
    config_error_from_pydantic,
)
from batchsim.workload.arrivals import AllAtOnceArrival, ArrivalProcess
from batchsim.workload.common import PositiveSeconds
from batchsim.workload.distributions import LengthDist, TimeDist
from batchsim.workload.structure import Conversation, SharedPrefix
from batchsim.workload.traces import TraceConfig
from batchsim.yamlio import line_of, read_mapping


class WorkloadConfig(ConfigModel):
    """The ``workload:`` block of an experiment.

    Open loop: ``arrival`` draws arrival times (or a ``trace`` supplies them). Closed loop:
    ``concurrency`` users each send their next request ``think_time_ms`` after the previous one
    finished; arrival times are then decided by the engine. ``num_requests`` and ``duration_s``
    both bound an open-loop workload (and may truncate a trace); whichever is hit first wins.
    A trace is read only up to its ``num_requests``-th row: rows after it are not checked.
    With a ``trace`` plus ``arrival`` or ``concurrency``, only the trace's token counts are used
    (in file order).

    Prefix structure: ``shared_prefix`` starts requests with one of a few shared prefixes
    (:class:`~batchsim.workload.structure.SharedPrefix`); ``conversation`` makes every request
    a turn of a multi-turn conversation (:class:`~batchsim.workload.structure.Conversation`):
    ``num_requests`` then counts turns, ``arrival`` starts conversations (open loop) or
    ``concurrency`` users run one conversation after another (closed loop), and
    ``think_time_ms`` separates a reply from the next turn. With both, each conversation
    starts with one shared prefix (a system prompt) in every turn.
    """

    num_requests: StrictInt | None = Field(
        default=None, ge=1, le=MAX_REQUESTS, description="number of requests (>= 1)"
    )
    duration_s: PositiveSeconds | None = Field(
        default=None, description="no arrivals at or after this simulated time, s"
    )
    arrival: ArrivalProcess | None = Field(default=None, description="open-loop arrival process")
    prompt_tokens: LengthDist | None = Field(default=None, description="prompt length distribution")
    output_tokens: LengthDist | None = Field(default=None, description="output length distribution")
    trace: TraceConfig | None = Field(default=None, description="trace file to replay")
    concurrency: StrictInt | None = Field(
        default=None, ge=1, le=MAX_REQUESTS, description="closed loop: number of users"
    )
    think_time_ms: TimeDist | None = Field(
        default=None, description="closed loop: pause between a user's requests, ms (default 0)"
    )
    cancel_after_ms: TimeDist | None = Field(
        default=None, description="client disconnects this long after arrival, ms (default never)"
    )
    shared_prefix: SharedPrefix | None = Field(
        default=None, description="requests start with one of count shared prefixes"
    )
    conversation: Conversation | None = Field(
        default=None, description="multi-turn conversations: each request is one turn"
    )

    @model_validator(mode="after")
    def _check_combination(self) -> WorkloadConfig:
        if self.arrival is not None and self.concurrency is not None:
            raise FieldError(
                "concurrency", "cannot be combined with arrival: closed loop or open loop, not both"
            )
        closed_or_turns = self.concurrency is not None or self.conversation is not None
        if self.think_time_ms is not None and not closed_or_turns:
            raise FieldError(
                "think_time_ms", "applies to closed loop (set concurrency) or conversation only"
            )
        if self.conversation is not None:
            if self.duration_s is not None:
                raise FieldError(
                    "duration_s",
                    "is not supported with conversation; use num_requests (it counts turns)",
                )
            if self.num_requests is None and self.trace is None:
                raise FieldError("num_requests", "is required with conversation (it counts turns)")
        if self.concurrency is not None and self.duration_s is not None:
            raise FieldError(
                "duration_s", "is not supported with concurrency (closed loop); use num_requests"
            )
        if self.trace is not None:
            if self.shared_prefix is not None:
                raise FieldError(
                    "shared_prefix",
                    "cannot be combined with trace (a csv trace names its shared prefixes in "
                    "columns prefix_group and prefix_tokens)",
                )
            if self.conversation is not None:
                raise FieldError("conversation", "cannot be combined with trace")
            for key in ("prompt_tokens", "output_tokens"):
                if getattr(self, key) is not None:
                    raise FieldError(key, "cannot be combined with trace (the trace has them)")
            uses_timestamps = self.arrival is None and self.concurrency is None
            if not uses_timestamps and self.trace.time_scale != 1.0:
                raise FieldError(
                    "trace.time_scale", "has no effect when arrival or concurrency is given"
                )
            cols = self.trace.columns
            if uses_timestamps and cols is not None and cols.arrival_time is None:
                raise FieldError(
                    "arrival", "or concurrency is required: trace.columns.arrival_time is null"
                )
        else:
            for key in ("prompt_tokens", "output_tokens"):
                if getattr(self, key) is None:
                    raise FieldError(key, "is required (or give a trace)")
            if self.arrival is None and self.concurrency is None:
                raise FieldError("arrival", "or concurrency is required (or give a trace)")
            if self.num_requests is None and self.duration_s is None:
                raise FieldError("num_requests", "or duration_s is required")
        if self.concurrency is not None and self.num_requests is None and self.trace is None:
            raise FieldError("num_requests", "is required with concurrency (closed loop)")
        all_at_once = isinstance(self.arrival, AllAtOnceArrival)
        if all_at_once and self.num_requests is None and self.trace is None:
            raise FieldError("num_requests", "is required with arrival all_at_once")
        if (
            self.arrival is not None
            and not all_at_once
            and self.duration_s is not None
            and self.num_requests is None
        ):
            expected = self.arrival.mean_rate() * self.duration_s
            if expected > MAX_REQUESTS:
                raise FieldError(
                    "duration_s",
                    f"x arrival rate ({self.arrival.mean_rate():g} req/s) must be <= "
                    f"{MAX_REQUESTS:,} requests, got about {expected:.3g}; shorten it or set "
                    "num_requests",
                )
        return self

    @property
    def closed_loop(self) -> bool:
        """True when ``concurrency`` users drive the arrivals."""
        return self.concurrency is not None


@dataclass(frozen=True)
class WorkloadDefinition:
    """A reusable workload file (``workloads/<name>.yaml``)."""

    name: str
    description: str
    config: WorkloadConfig
    base_dir: Path
    """Directory of the file (relative trace/data paths in it are resolved there)."""
    path: Path


def parse_workload(
    data: Any, *, prefix: str = "workload", source: str | None = None
) -> WorkloadConfig:
    """Validate a ``workload:`` mapping.

    Raises:
        ConfigError: One line naming ``prefix.key.path``, the rule and the value.
    """
    try:
        return WorkloadConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_pydantic(exc, prefix, source, model=WorkloadConfig) from None


def load_workload(name_or_path: str, key: str = "workload") -> WorkloadDefinition:
    """Load a workload file: a built-in name (``sharegpt-like``) or a YAML path.

    The file is a ``workload:`` block written at top level, plus optional ``name`` and
    ``description`` (an experiment may say ``workload: sharegpt-like``). Sources of the numbers
    go in YAML comments.

    Raises:
        ConfigError: Unknown name, unreadable YAML or an invalid block (file and line named).
    """
    path = resolve("workloads", name_or_path, key)
    data, text = read_mapping(path)
    name = str(data.pop("name", path.stem))
    description = " ".join(str(data.pop("description", "")).split())
    try:
        cfg = WorkloadConfig.model_validate(data)
    except ValidationError as exc:
        err = config_error_from_pydantic(exc, "", None, model=WorkloadConfig)
        key_path = err.message.split(" ", 1)[0].rstrip(":").split(".")
        raise ConfigError(err.message, str(path), line_of(text, key_path)) from None
    return WorkloadDefinition(name, description, cfg, path.parent, path)
