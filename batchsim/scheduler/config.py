"""The ``scheduler:`` block of an experiment (a pydantic model: kept apart from the policies'
shared mechanism, :mod:`.interface`, which the compiled build compiles)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from batchsim.validation import (
    MAX_BATCH_TOKENS,
    MAX_MS,
    MAX_REQUESTS,
    StrictBool,
    StrictFloat,
    StrictInt,
)
from batchsim.yamlio import check_plain_data


class SchedulerConfig(BaseModel):
    """The ``scheduler:`` block of an experiment. Policies read the keys they need."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    policy: str = "continuous"
    """static | dynamic | continuous | chunked_prefill, or ``package.module:Class``."""
    max_num_seqs: StrictInt = Field(256, ge=1, le=MAX_REQUESTS)
    """Batch cap B: most requests in one iteration (and, for request-level policies, in a batch)."""
    max_num_batched_tokens: StrictInt = Field(8192, ge=1, le=MAX_BATCH_TOKENS)
    """Most new tokens in one iteration (B x S); the chunked-prefill token budget."""
    max_wait_ms: StrictFloat = Field(50.0, ge=0, le=MAX_MS)
    """dynamic: launch a batch when the oldest queued request has waited this long (ms)."""
    padding: StrictBool = True
    """static/dynamic: pad prompts to the longest one and keep computing finished rows
    (naive batched generate); false packs tokens and skips finished rows."""
    mix_prefill_decode: StrictBool = False
    """continuous: false = an iteration with prefills runs no decodes (vLLM v0);
    true = prefills and decodes share the iteration (Orca selective batching)."""
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    """What happens to a request evicted from a full KV cache: ``recompute`` drops its KV and
    recomputes it when the request is scheduled again (vLLM's default); ``swap`` copies its
    blocks to host memory (``engine.swap_space_gib``) and back before it resumes, paying the
    host link's transfer time; when the swap space is full it recomputes instead."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Free-form settings for out-of-tree policies (``package.module:Class``): plain data
    (strings, finite numbers, booleans, null, lists, mappings), bounded like a YAML file."""

    @field_validator("options")
    @classmethod
    def _plain_bounded_data(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_plain_data(value)
