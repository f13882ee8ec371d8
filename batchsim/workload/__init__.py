"""Workloads: which requests arrive when, with how many prompt and output tokens.

This package owns the ``workload:`` block of an experiment: the config models (arrival processes,
token-length distributions, think/cancel-time distributions, trace files), the loaders of public
traces (Azure LLM inference 2023/2024 CSV, Mooncake JSONL, BurstGPT CSV, generic CSV) and
:func:`generate`, which turns a config and a seed into a :class:`RequestTable` of numpy arrays.
It also lists the built-in ``workloads/`` catalog (:func:`workload_table`).

Modules (every public name is re-exported here; import from ``batchsim.workload``):

- :mod:`~batchsim.workload.common`: shared field types and ``describe()`` rendering.
- :mod:`~batchsim.workload.moments`: continuous bases and exact rounded/clipped moments.
- :mod:`~batchsim.workload.distributions`: token-length and time distributions.
- :mod:`~batchsim.workload.arrivals`: open-loop arrival processes.
- :mod:`~batchsim.workload.files`: data-file lookup and strict parsing with file:line errors.
- :mod:`~batchsim.workload.traces`: ``trace:`` config and the trace readers.
- :mod:`~batchsim.workload.columnar`: the fast, columnar (pyarrow) path of the trace readers.
- :mod:`~batchsim.workload.columnar_checks`: what that path checks in the bytes and columns.
- :mod:`~batchsim.workload.columnar_times`: Azure timestamps parsed in bulk for that path.
- :mod:`~batchsim.workload.prefix`: :class:`PrefixTable`, the shared segments of requests.
- :mod:`~batchsim.workload.structure`: shared prefixes and multi-turn conversations.
- :mod:`~batchsim.workload.config`: :class:`WorkloadConfig`, workload files.
- :mod:`~batchsim.workload.generation`: :func:`generate` and :class:`RequestTable`.
- :mod:`~batchsim.workload.listing`: :func:`workload_table`.

Randomness: :func:`generate` splits ``numpy.random.SeedSequence(seed)`` into independent child
streams for arrivals, prompt lengths, output lengths, cancellations, think times, shared-prefix
lengths, shared-prefix choices and turns per conversation, in that order, so changing one part
of the workload never shifts the others. There is no global random
state and all sampling is vectorised.

Token counts: continuous distributions are rounded half-to-even (``numpy.rint``) and then clipped
to ``[min, max]`` (``min`` defaults to 1, so every count is an integer >= 1). The exception is
``exponential``, whose ``max`` *truncates* (values above it are redrawn) like the
``capped_exponential`` of the Anyscale continuous-batching benchmark; its ``min`` clips.

Must not import: simpy, ``batchsim.engine``, ``batchsim.scheduler``, ``batchsim.cost``. The
workload only describes requests; it never runs them.
"""

from __future__ import annotations

from batchsim.workload.arrivals import (
    ARRIVAL_PROCESSES,
    AllAtOnceArrival,
    BurstArrival,
    ConstantArrival,
    GammaArrival,
    PoissonArrival,
)
from batchsim.workload.arrivals import MAX_GENERATED_REQUESTS as MAX_GENERATED_REQUESTS
from batchsim.workload.arrivals import ArrivalProcess as ArrivalProcess
from batchsim.workload.common import NonNegativeFinite as NonNegativeFinite
from batchsim.workload.common import PositiveFinite as PositiveFinite
from batchsim.workload.common import TokenCount as TokenCount
from batchsim.workload.config import (
    WorkloadConfig,
    WorkloadDefinition,
    load_workload,
    parse_workload,
)
from batchsim.workload.distributions import (
    LENGTH_DISTRIBUTIONS,
    TIME_DISTRIBUTIONS,
    EmpiricalLength,
    ExponentialLength,
    ExponentialTime,
    FixedLength,
    FixedTime,
    LognormalLength,
    LognormalTime,
    NormalLength,
    NormalTime,
    UniformLength,
    UniformTime,
    ZipfLength,
)
from batchsim.workload.distributions import MAX_ZIPF_SUPPORT as MAX_ZIPF_SUPPORT
from batchsim.workload.distributions import LengthDist as LengthDist
from batchsim.workload.distributions import TimeDist as TimeDist
from batchsim.workload.files import resolve_data_path
from batchsim.workload.generation import RequestTable, generate, trace_notes
from batchsim.workload.listing import workload_table
from batchsim.workload.prefix import PrefixTable
from batchsim.workload.structure import Conversation, SharedPrefix, ZipfPopularity
from batchsim.workload.traces import TRACE_FORMATS, CsvColumns, TraceConfig, load_trace

__all__ = [
    "ARRIVAL_PROCESSES",
    "LENGTH_DISTRIBUTIONS",
    "TIME_DISTRIBUTIONS",
    "TRACE_FORMATS",
    "AllAtOnceArrival",
    "BurstArrival",
    "ConstantArrival",
    "Conversation",
    "CsvColumns",
    "EmpiricalLength",
    "ExponentialLength",
    "ExponentialTime",
    "FixedLength",
    "FixedTime",
    "GammaArrival",
    "LognormalLength",
    "LognormalTime",
    "NormalLength",
    "NormalTime",
    "PoissonArrival",
    "PrefixTable",
    "RequestTable",
    "SharedPrefix",
    "TraceConfig",
    "UniformLength",
    "UniformTime",
    "WorkloadConfig",
    "WorkloadDefinition",
    "ZipfLength",
    "ZipfPopularity",
    "generate",
    "load_trace",
    "load_workload",
    "parse_workload",
    "resolve_data_path",
    "trace_notes",
    "workload_table",
]
