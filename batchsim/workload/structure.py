"""Prefix structure of synthetic workloads: shared prompts and multi-turn conversations.

Owns the ``workload.shared_prefix`` block (:class:`SharedPrefix`: ``count`` distinct shared
prefixes, e.g. the system prompts of a multi-tenant service, their lengths, which one a
request picks and how many requests pick one) and the ``workload.conversation`` block
(:class:`Conversation`: turns per conversation), and the array work that turns draws into
prompts and content ids: :func:`choose_prefixes`, :func:`cut_conversations`,
:func:`conversation_prompts`. The segments themselves are built by
:mod:`batchsim.workload.prefix`; the draws come from :func:`batchsim.workload.generate`'s
streams.

Content ids of one run: shared prefix ``k`` is id ``k`` (0 .. count - 1); the turns of
conversations follow (see :meth:`~batchsim.workload.prefix.PrefixTable.from_conversations`).
"""

from __future__ import annotations

import numbers
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from batchsim.validation import (
    MAX_REQUESTS,
    ConfigModel,
    FieldError,
    StrictFloat,
    StrictInt,
    format_value,
    number_problem,
)
from batchsim.workload.distributions import LengthDist

MAX_POPULARITY_EXPONENT = 100.0
"""Largest ``popularity: {zipf: s}`` exponent."""
MAX_POPULARITY_WEIGHT = 1e12
"""Largest weight of a ``popularity`` list (weights are relative; the cap keeps sums finite)."""

_POPULARITY_RULE = "must be uniform, {zipf: s} or a list of weights (one per prefix)"


class ZipfPopularity(ConfigModel):
    """Prefix ``k`` (0-based) is picked with probability proportional to ``(k + 1)^-zipf``."""

    zipf: StrictFloat = Field(
        ge=0, le=MAX_POPULARITY_EXPONENT, description="exponent s (0: uniform; 1: classic Zipf)"
    )


Weight = Annotated[StrictFloat, Field(ge=0, le=MAX_POPULARITY_WEIGHT)]
Popularity = Literal["uniform"] | ZipfPopularity | tuple[Weight, ...]


def _plain(value: Any) -> Any:
    """A numpy number as a Python one (booleans stay booleans: they are no weights)."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, int, float)):
        return int(value) if isinstance(value, numbers.Integral) else float(value)
    return value


def _read_popularity(value: Any) -> Any:
    """Check a ``popularity`` value and give it the form of one of :data:`Popularity`'s
    members, naming the key at fault (pydantic's own error on a union names its members)."""
    if isinstance(value, (str, ZipfPopularity)):
        if value == "uniform" or isinstance(value, ZipfPopularity):
            return value
    elif isinstance(value, dict):
        if set(value) == {"zipf"}:
            problem = number_problem(_plain(value["zipf"]), ge=0, le=MAX_POPULARITY_EXPONENT)
            if problem:
                raise FieldError("popularity.zipf", problem)
            return {"zipf": _plain(value["zipf"])}
    elif isinstance(value, (list, tuple)):
        weights = [_plain(w) for w in value]
        for i, weight in enumerate(weights):
            problem = number_problem(weight, ge=0, le=MAX_POPULARITY_WEIGHT)
            if problem:
                raise FieldError(f"popularity[{i}]", problem)
        if not any(w > 0 for w in weights):
            raise FieldError("popularity", f"must hold a weight > 0, got {format_value(value)}")
        return tuple(weights)
    raise FieldError("popularity", f"{_POPULARITY_RULE}; got {format_value(value)}")


class SharedPrefix(ConfigModel):
    """Requests that start with one of ``count`` shared prefixes (system prompts, few-shot
    examples, a shared document).

    The ``count`` prefix lengths are drawn once per run from ``tokens``. Each request (each
    conversation, with ``conversation``) starts with a shared prefix with probability
    ``fraction``, and then with prefix ``k`` with the probability ``popularity`` gives it:
    ``uniform``, ``{zipf: s}`` (prefix ``k`` = 0, 1, ... weighted ``(k + 1)^-s``: the first is
    the most popular) or a list of ``count`` weights. Its prompt is the prefix followed by its
    own ``prompt_tokens``: ``prompt_tokens`` draws the request's own part, and the prompt
    length the engine sees (``prompt_tokens`` in ``requests.csv``) is the total.
    """

    count: StrictInt = Field(
        ge=1, le=MAX_REQUESTS, description="number of distinct shared prefixes (>= 1)"
    )
    tokens: LengthDist = Field(description="length of each shared prefix, tokens")
    popularity: Popularity = Field(
        default="uniform",
        description="which prefix a request picks: uniform, {zipf: s} or a list of weights",
    )
    fraction: StrictFloat = Field(
        default=1.0,
        ge=0,
        le=1,
        description="share of requests (conversations) that start with a shared prefix",
    )

    @model_validator(mode="before")
    @classmethod
    def _check_popularity(cls, data: Any) -> Any:
        if isinstance(data, dict) and "popularity" in data:
            data = {**data, "popularity": _read_popularity(data["popularity"])}
        return data

    @model_validator(mode="after")
    def _check_weights(self) -> SharedPrefix:
        if isinstance(self.popularity, tuple) and len(self.popularity) != self.count:
            raise FieldError(
                "popularity",
                f"must list one weight per prefix (count = {self.count}), got "
                f"{len(self.popularity)}",
            )
        return self

    def probabilities(self) -> np.ndarray:
        """The probability of each prefix, given that a request picks one (float64)."""
        k = self.count
        if self.popularity == "uniform":
            return np.full(k, 1.0 / k)
        if isinstance(self.popularity, ZipfPopularity):
            weights = np.arange(1, k + 1, dtype=np.float64) ** -float(self.popularity.zipf)
        else:
            weights = np.asarray(self.popularity, dtype=np.float64)
        return weights / weights.sum()

    def describe(self) -> str:
        """One line, e.g. ``8 x lognormal(mean=800, sigma=0.5), zipf 1.1, fraction 0.9``."""
        pop = self.popularity
        if isinstance(pop, ZipfPopularity):
            picked = f"zipf {pop.zipf:g}"
        elif isinstance(pop, tuple):
            picked = "weighted"
        else:
            picked = "uniform"
        out = f"{self.count} x {self.tokens.describe()}, {picked}"
        return out if self.fraction == 1.0 else f"{out}, fraction {self.fraction:g}"


class Conversation(ConfigModel):
    """Multi-turn conversations: every request is one turn of a conversation.

    A conversation has ``turns`` turns. Turn ``k``'s prompt is the whole conversation so far
    (the shared prefix, if any, then every earlier turn's user tokens and reply) followed by
    its new user tokens: ``prompt_tokens`` draws each turn's new user tokens and
    ``output_tokens`` each reply. A turn arrives ``think_time_ms`` after the previous turn
    finished; a turn that is rejected or cancelled ends its conversation (its later turns are
    never sent). ``num_requests`` counts turns: conversations are drawn until they hold that
    many, and the last one is cut short to fit.
    """

    turns: LengthDist = Field(description="turns per conversation (>= 1)")

    def describe(self) -> str:
        return f"turns={self.turns.describe()}"


def choose_prefixes(
    cfg: SharedPrefix, lengths: np.ndarray, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Which shared prefix each of ``n`` requests (or conversations) starts with.

    Two uniform draws per unit, in this order: ``n`` for "has a prefix" (below ``fraction``),
    then ``n`` for which one (inverse CDF of :meth:`SharedPrefix.probabilities`). A unit keeps
    its draws when ``fraction`` changes, so a larger fraction adds prefixes to more units and
    takes none away.

    Args:
        cfg: The ``shared_prefix`` block.
        lengths: The ``count`` prefix lengths (tokens).
        rng: The stream to draw from.
        n: Number of units.

    Returns:
        (prefix index, or -1 for none; its tokens, or 0), both int64.
    """
    has = rng.random(n) < cfg.fraction
    weights = cfg.probabilities()
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]  # exactly 1.0 at the end: a draw < 1 never runs past the last prefix
    pick = np.searchsorted(cdf, rng.random(n), side="right").astype(np.int64)
    ids = np.where(has, pick, -1)
    tokens = np.where(has, np.asarray(lengths, dtype=np.int64)[pick], 0)
    return ids, tokens


def cut_conversations(turns: np.ndarray, num_requests: int) -> np.ndarray:
    """Turns of each conversation so that they add up to ``num_requests``: the first drawn
    counts (each >= 1) up to the one that reaches it, that one cut short."""
    total = np.cumsum(turns)
    assert len(total) and total[-1] >= num_requests, "too few turns drawn"
    count = int(np.searchsorted(total, num_requests)) + 1  # first cumulative sum >= n
    out = np.array(turns[:count], dtype=np.int64)
    out[-1] -= int(total[count - 1]) - num_requests
    return out


def conversation_prompts(
    turns: np.ndarray, user: np.ndarray, reply: np.ndarray, system: np.ndarray
) -> np.ndarray:
    """Prompt tokens of every turn: its conversation's system prefix, every earlier turn's
    user tokens and reply, then its own user tokens.

    Args:
        turns: Turns of each conversation; the turns are listed conversation by conversation.
        user: New user tokens of each turn.
        reply: Reply (output) tokens of each turn.
        system: Shared-prefix tokens of each conversation (0: none).
    """
    n = len(user)
    conv = np.repeat(np.arange(len(turns)), turns)
    start = np.cumsum(turns) - turns  # index of each conversation's first turn
    before = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(user + reply, out=before[1:])  # tokens of all turns before turn i
    history = before[:n] - before[start[conv]]
    return np.asarray(system, dtype=np.int64)[conv] + history + user


def next_turns(turns: np.ndarray) -> np.ndarray:
    """The request that follows each turn in its conversation (int64; -1 after the last)."""
    n = int(np.sum(turns))
    out = np.arange(1, n + 1, dtype=np.int64)
    out[np.cumsum(turns) - 1] = -1
    return out
