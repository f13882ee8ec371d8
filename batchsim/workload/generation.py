"""Drawing the requests of a run: :func:`generate` and the :class:`RequestTable` it returns.

Owns the split of ``numpy.random.SeedSequence(seed)`` into the child streams (arrivals, prompt
lengths, output lengths, cancellations, think times, then shared-prefix lengths, shared-prefix
choices and turns per conversation, in that order) and the assembly of synthetic or
trace-replayed requests into parallel numpy arrays. The streams are spawned by position, so
the later ones do not change what the earlier ones draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from batchsim.errors import ConfigError
from batchsim.validation import MAX_MS, MAX_SECONDS, MAX_TOKENS
from batchsim.workload.config import WorkloadConfig
from batchsim.workload.prefix import PrefixTable
from batchsim.workload.structure import (
    choose_prefixes,
    conversation_prompts,
    cut_conversations,
    next_turns,
)
from batchsim.workload.traces import load_trace, skipped_note


@dataclass(frozen=True, eq=False)
class RequestTable:
    """All requests of one run, as parallel numpy arrays (index = request id).

    Treat the arrays as read-only; copy before modifying.
    """

    arrival_time: np.ndarray
    """float64 seconds, non-decreasing; NaN for closed loop (the engine decides). With
    conversations (:attr:`next_turn`): a conversation's start at its first turn, NaN at the
    later turns (the engine decides)."""
    prompt_tokens: np.ndarray
    """int64 >= 1."""
    output_tokens: np.ndarray
    """int64 >= 1."""
    cancel_after: np.ndarray | None = None
    """float64 seconds after arrival when the client disconnects (inf = never), or None."""
    think_time: np.ndarray | None = None
    """Closed loop or conversations: seconds a user waits after its previous request left
    before sending this one, else None."""
    concurrency: int | None = None
    """Closed loop: number of users, else None."""
    prefix: PrefixTable | None = field(default=None)
    """What each request's sequence shares with others (:mod:`batchsim.workload.prefix`),
    or None when nothing is shared."""
    next_turn: np.ndarray | None = None
    """Conversations: the request that is the next turn of each request's conversation
    (int64, -1 after the last turn), else None. Turns of a conversation are listed in order
    and a first turn is a request no other one names; conversations start in table order."""

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        assert len(self.arrival_time) == n and len(self.output_tokens) == n, "length mismatch"
        for name in ("cancel_after", "think_time", "prefix", "next_turn"):
            value = getattr(self, name)
            assert value is None or len(value) == n, f"{name} length mismatch"

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def num_requests(self) -> int:
        """Number of requests."""
        return len(self.prompt_tokens)


def _check_drawn(values: np.ndarray, limit: float, key: str, unit: str, advice: str) -> None:
    """A drawn value above ``limit`` is an error (never clipped silently)."""
    if len(values) and values.max() > limit:
        raise ConfigError(
            f"{key}: a drawn value is {float(values.max()):.3g} {unit}, more than the limit of "
            f"{limit:,g} {unit}; set a lower {advice}"
        )


def _check_think_span(think: np.ndarray, cfg: WorkloadConfig, turns: np.ndarray | None) -> None:
    """A closed loop whose users would think past MAX_SECONDS is an error before it runs.

    Every request but each user's first is sent a think time after its previous one left, so
    the busiest user's last request comes at least (the sum of those think times) / users after
    t = 0, however the requests fall to the users.
    """
    assert cfg.concurrency is not None
    starts = np.arange(len(think)) if turns is None else np.cumsum(turns) - turns
    waiting = float(think.sum() - think[starts[: cfg.concurrency]].sum())
    span = waiting / min(cfg.concurrency, len(starts))
    if span > MAX_SECONDS:
        raise ConfigError(
            f"workload.think_time_ms: {len(think)} requests of {cfg.concurrency} users think "
            f"{span:.3g} s each user on average, more than the limit of {MAX_SECONDS:g} s of "
            "simulated time; set a lower think time or fewer num_requests"
        )


def _child_rngs(seed: int) -> dict[str, np.random.Generator]:
    # New streams go at the end: a child's draws depend only on its position.
    names = ("arrival", "prompt", "output", "cancel", "think", "prefix_tokens", "prefix", "turns")
    children = np.random.SeedSequence(seed).spawn(len(names))
    return {name: np.random.default_rng(child) for name, child in zip(names, children, strict=True)}


def generate(cfg: WorkloadConfig, seed: int, base_dir: Path | None = None) -> RequestTable:
    """Draw the requests of a workload.

    Args:
        cfg: The validated ``workload:`` block.
        seed: Non-negative integer; the same seed gives identical arrays.
        base_dir: Directory of the experiment file; relative trace/data paths are looked up
            there first (None: the current directory), then in the built-in catalog.

    Returns:
        The request table.

    Raises:
        ConfigError: Unreadable or malformed trace/data file (a trace is read only up to its
            ``num_requests``-th row), a trace shorter than ``num_requests``, or no request at
            all.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    rngs = _child_rngs(int(seed))
    closed = cfg.concurrency is not None
    prefix: PrefixTable | None = None
    turns: np.ndarray | None = None  # conversations: turns of each
    next_turn: np.ndarray | None = None

    if cfg.trace is not None:
        trace = load_trace(cfg.trace, base_dir, limit=cfg.num_requests)  # reads only those rows
        if cfg.num_requests is not None and cfg.num_requests > len(trace):
            raise ConfigError(
                f"workload.num_requests={cfg.num_requests} exceeds the {len(trace)} requests "
                f"in trace {cfg.trace.path}"
            )
        limit = cfg.num_requests if cfg.num_requests is not None else len(trace)
        if closed:
            arrival = np.full(limit, np.nan)
        elif cfg.arrival is not None:
            arrival = cfg.arrival.sample(rngs["arrival"], limit, cfg.duration_s)
        else:
            assert trace.arrival_time is not None
            arrival = trace.arrival_time[:limit] * cfg.trace.time_scale
            if cfg.duration_s is not None:
                arrival = arrival[arrival < cfg.duration_s]
            if len(arrival) and arrival[-1] > MAX_SECONDS:
                raise ConfigError(
                    f"workload.trace.time_scale={cfg.trace.time_scale:g} puts the last arrival of "
                    f"trace {cfg.trace.path} at {arrival[-1]:.3g} s, more than the limit of "
                    f"{MAX_SECONDS:g} s"
                )
        n = len(arrival)
        prompt = trace.prompt_tokens[:n].copy()
        output = trace.output_tokens[:n].copy()
        if trace.hash_ids is not None:
            prefix = _hash_id_prefixes(trace.hash_ids, prompt)
        elif trace.prefix_tokens is not None:
            assert trace.prefix_group is not None
            prefix = PrefixTable.from_groups(trace.prefix_group[:n], trace.prefix_tokens[:n])
    else:
        assert cfg.prompt_tokens is not None and cfg.output_tokens is not None
        if cfg.conversation is not None:
            assert cfg.num_requests is not None
            turns = _draw_turns(cfg, rngs["turns"], base_dir)
            next_turn = next_turns(turns)
        if closed:
            assert cfg.num_requests is not None
            arrival = np.full(cfg.num_requests, np.nan)
        elif turns is not None:
            assert cfg.arrival is not None and cfg.num_requests is not None
            arrival = np.full(cfg.num_requests, np.nan)
            arrival[np.cumsum(turns) - turns] = cfg.arrival.sample(
                rngs["arrival"], len(turns), None
            )
        else:
            assert cfg.arrival is not None
            arrival = cfg.arrival.sample(rngs["arrival"], cfg.num_requests, cfg.duration_s)
        n = len(arrival)
        prompt = cfg.prompt_tokens.sample(rngs["prompt"], n, base_dir)
        output = cfg.output_tokens.sample(rngs["output"], n, base_dir)
        _check_drawn(prompt, MAX_TOKENS, "workload.prompt_tokens", "tokens", "max")
        _check_drawn(output, MAX_TOKENS, "workload.output_tokens", "tokens", "max")
        if cfg.shared_prefix is not None or turns is not None:
            prompt, prefix = _structure(cfg, rngs, base_dir, prompt, output, turns)

    if n == 0:
        raise ConfigError(
            f"workload: no request arrives before duration_s={cfg.duration_s:g}"
            if cfg.duration_s is not None
            else "workload: no requests"
        )
    cancel = None
    if cfg.cancel_after_ms is not None:
        cancel_ms = cfg.cancel_after_ms.sample(rngs["cancel"], n)
        _check_drawn(cancel_ms, MAX_MS, "workload.cancel_after_ms", "ms", "mean or sigma")
        cancel = cancel_ms / 1000.0
    think = None
    if closed or turns is not None:
        if cfg.think_time_ms is not None:
            think_ms = cfg.think_time_ms.sample(rngs["think"], n)
            _check_drawn(think_ms, MAX_MS, "workload.think_time_ms", "ms", "mean or sigma")
            think = think_ms / 1000.0
            if closed:
                _check_think_span(think, cfg, turns)
        else:
            think = np.zeros(n)
    return RequestTable(
        arrival_time=np.ascontiguousarray(arrival, dtype=np.float64),
        prompt_tokens=np.ascontiguousarray(prompt, dtype=np.int64),
        output_tokens=np.ascontiguousarray(output, dtype=np.int64),
        cancel_after=cancel,
        think_time=think,
        concurrency=cfg.concurrency,
        prefix=prefix,
        next_turn=next_turn,
    )


def trace_notes(cfg: WorkloadConfig, base_dir: Path | None = None) -> list[str]:
    """What the user should know about the trace ``cfg`` replays: the rows left out (BurstGPT
    rows with 0 response or request tokens) and, with ``arrival`` or ``concurrency``, that
    its arrival times are not used; one line each, empty without a trace. Reads the
    trace as :func:`generate` does (a cache hit after it)."""
    if cfg.trace is None:
        return []
    trace = load_trace(cfg.trace, base_dir, limit=cfg.num_requests)
    note = skipped_note(trace, cfg.trace.path)
    notes = [note] if note is not None else []
    if trace.arrival_time is not None and (cfg.arrival is not None or cfg.concurrency is not None):
        times = (
            f"workload.arrival ({cfg.arrival.describe()}) draws them"
            if cfg.arrival is not None
            else f"the closed loop of workload.concurrency={cfg.concurrency} decides them"
        )
        notes.append(
            f"the arrival times of trace {cfg.trace.path} are not used: {times}; the trace "
            "gives the token counts"
        )
    return notes


def _draw_turns(cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path | None) -> np.ndarray:
    """Turns of each conversation, adding up to ``num_requests`` (the last one cut short).

    As many counts are drawn as there are requests (each is >= 1, so they always suffice):
    the conversations kept do not depend on how many more would follow.
    """
    assert cfg.conversation is not None and cfg.num_requests is not None
    drawn = cfg.conversation.turns.sample(rng, cfg.num_requests, base_dir)
    _check_drawn(drawn, MAX_TOKENS, "workload.conversation.turns", "turns", "max")
    return cut_conversations(drawn, cfg.num_requests)


def _structure(
    cfg: WorkloadConfig,
    rngs: dict[str, np.random.Generator],
    base_dir: Path | None,
    prompt: np.ndarray,
    output: np.ndarray,
    turns: np.ndarray | None,
) -> tuple[np.ndarray, PrefixTable | None]:
    """Prompts and segments (None when nothing is shared) of a workload with shared prefixes
    and/or conversations: ``prompt`` holds each request's own tokens (a turn's new user
    tokens)."""
    shared = cfg.shared_prefix
    units = len(prompt) if turns is None else len(turns)  # requests, or conversations
    if shared is not None:
        lengths = shared.tokens.sample(rngs["prefix_tokens"], shared.count, base_dir)
        _check_drawn(lengths, MAX_TOKENS, "workload.shared_prefix.tokens", "tokens", "max")
        prefix_ids, prefix_tokens = choose_prefixes(shared, lengths, rngs["prefix"], units)
    else:
        prefix_ids = np.full(units, -1, dtype=np.int64)
        prefix_tokens = np.zeros(units, dtype=np.int64)
    if turns is None:
        total = prompt + prefix_tokens
        _check_prompts(total, "workload.shared_prefix", "(shared prefix + prompt_tokens)", "")
        shares = bool(prefix_tokens.any())  # fraction 0: nothing is shared
        return total, PrefixTable.from_groups(prefix_ids, prefix_tokens) if shares else None
    total = conversation_prompts(turns, prompt, output, prefix_tokens)
    _check_prompts(
        total,
        "workload.conversation",
        "(the conversation so far)",
        "; set fewer turns or shorter prompt_tokens or output_tokens",
    )
    first_id = 0 if shared is None else shared.count  # ids after the shared prefixes'
    table = PrefixTable.from_conversations(
        turns, prompt, output, prefix_ids, prefix_tokens, first_id
    )
    return total, table


def _check_prompts(prompt: np.ndarray, key: str, what: str, advice: str) -> None:
    """A prompt put together from several parts must stay within the token limit."""
    if len(prompt) and prompt.max() > MAX_TOKENS:
        raise ConfigError(
            f"{key}: a prompt has {int(prompt.max()):,} tokens {what}, more than the limit "
            f"of {MAX_TOKENS:,} tokens{advice}"
        )


def _hash_id_prefixes(hash_ids: Sequence[list[int]], prompt: np.ndarray) -> PrefixTable:
    """The segments of Mooncake ``hash_ids`` (of the first ``len(prompt)`` rows)."""
    n = len(prompt)
    flat = getattr(hash_ids, "flat", None)  # a HashIds from the columnar reader
    if flat is not None:
        values, offsets = flat()
        offsets = offsets[: n + 1]
    else:
        rows = list(hash_ids[:n])
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=offsets[1:])
        values = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=int(offsets[-1]))
    return PrefixTable.from_hash_ids(values, offsets, prompt)
