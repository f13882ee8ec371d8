"""The blocks of an experiment that policies read: ``scheduler:`` and ``engine.speculative:``
(pydantic models: kept apart from the policies' shared mechanism, :mod:`.interface`, which the
compiled build compiles)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from batchsim.validation import (
    MAX_BATCH_TOKENS,
    MAX_MS,
    MAX_REQUESTS,
    MAX_STEP_MS,
    ConfigModel,
    FieldError,
    StrictBool,
    StrictFloat,
    StrictInt,
    config_error_from_pydantic,
    number_problem,
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
    mix_prefill_decode: StrictBool | None = None
    """Whether prefills and the running decodes share an iteration. continuous (default
    false): false = an iteration with prefills runs no decodes (vLLM v0), true = they share
    it (Orca selective batching). chunked_prefill (default true): true = the decodes go first
    and prompt chunks fill the budget (vLLM v1), false = an iteration with prompt chunks runs
    no decodes (SGLang without ``--enable-mixed-chunk``)."""
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


class AcceptanceDist(ConfigModel):
    """A per-request acceptance rate drawn from a distribution: ``{dist: beta, a, b}``
    (mean a / (a + b)) or ``{dist: uniform, low, high}``."""

    dist: Literal["beta", "uniform"]
    a: StrictFloat | None = Field(None, gt=0, le=1e6)
    """beta: first shape parameter."""
    b: StrictFloat | None = Field(None, gt=0, le=1e6)
    """beta: second shape parameter."""
    low: StrictFloat | None = Field(None, ge=0, le=1)
    """uniform: lowest rate."""
    high: StrictFloat | None = Field(None, ge=0, le=1)
    """uniform: highest rate."""

    @model_validator(mode="after")
    def _parameters(self) -> AcceptanceDist:
        need = ("a", "b") if self.dist == "beta" else ("low", "high")
        for key in ("a", "b", "low", "high"):
            given = getattr(self, key) is not None
            if key in need and not given:
                raise FieldError(key, f"is required with dist: {self.dist}")
            if key not in need and given:
                raise FieldError(key, f"does not apply to dist: {self.dist}")
        if self.low is not None and self.high is not None and self.high < self.low:
            raise FieldError("high", f"must be >= low ({self.low}), got {self.high}")
        return self

    @property
    def mean(self) -> float:
        if self.dist == "beta":
            assert self.a is not None and self.b is not None
            return self.a / (self.a + self.b)
        assert self.low is not None and self.high is not None
        return (self.low + self.high) / 2


MAX_SPECULATIVE_TOKENS = 64


class SpeculativeConfig(ConfigModel):
    """``engine.speculative:`` — speculative decoding (Leviathan et al.; vLLM's
    ``speculative_config``): each decode iteration proposes ``num_speculative_tokens`` tokens
    per decoding request, the target model verifies them in one pass over k + 1 rows, and the
    leading accepted drafts plus one bonus token are emitted."""

    method: Literal["draft", "ngram", "eagle"]
    """``draft``: a small model of the catalog on the same GPUs; ``ngram``: prompt lookup
    (no model); ``eagle``: a draft head whose cost per proposed token is given."""
    draft_model: str | None = None
    """method draft: the draft model (catalog name or YAML path)."""
    num_speculative_tokens: StrictInt = Field(ge=1, le=MAX_SPECULATIVE_TOKENS)
    """k: tokens proposed per decoding request and iteration."""
    acceptance_rate: StrictFloat | AcceptanceDist
    """alpha: probability that each proposed token is accepted (given the ones before it
    were), fixed or drawn per request from ``{dist: beta, a, b}`` / ``{dist: uniform, low,
    high}``."""
    proposer_ms_per_token: StrictFloat = Field(0.0, ge=0, le=MAX_STEP_MS)
    """ngram/eagle: GPU time of one proposal step of the batch (one token per request), ms."""

    @field_validator("acceptance_rate", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> Any:
        if isinstance(value, AcceptanceDist):
            return value
        if isinstance(value, Mapping):
            try:
                return AcceptanceDist.model_validate(value)
            except ValidationError as exc:  # one line naming the nested key
                error = config_error_from_pydantic(exc, "", model=AcceptanceDist)
                raise FieldError("", f"{{dist: ...}}: {error.message}") from None
        problem = number_problem(value, ge=0, le=1)
        if problem:
            raise FieldError("", f"{problem} (a probability in [0, 1], or {{dist: beta, a, b}})")
        return float(value)

    @model_validator(mode="after")
    def _method_keys(self) -> SpeculativeConfig:
        if self.method == "draft":
            if self.draft_model is None:
                raise FieldError("draft_model", "is required with method: draft")
            if self.proposer_ms_per_token:
                raise FieldError(
                    "proposer_ms_per_token",
                    "does not apply to method: draft (the draft model is priced)",
                )
        elif self.draft_model is not None:
            raise FieldError("draft_model", f"applies to method: draft only, not {self.method}")
        return self
