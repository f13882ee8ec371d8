"""The policy contract: what a batching policy implements, what it reads, what it may call.

A policy decides *which* requests run in the next iteration and *how many tokens* each
computes. Everything else — admission checks, KV blocks, prefix caching, preemption,
appending sampled tokens, finishing at the output length, cancellation, timestamps — is the
base class's, once. The engine's loop around a policy::

    output = policy.schedule(now)               # yours: the next iteration
    ... one forward pass of output.shape ...    # the cost model prices it
    policy.update_from_output(output, times)    # the base class: tokens, finishes, KV

**You implement** :meth:`Scheduler.schedule` (required) and, when you need them,
:meth:`~Scheduler.next_timer`, :meth:`~Scheduler.policy_reject_reason`,
:meth:`~Scheduler.on_request_left` and the classmethod ``check_config(config)`` (reject
settings the policy cannot run with: raise :class:`~batchsim.errors.ConfigError`). Class
attributes: ``name`` (the registry name), ``config_keys`` (the ``scheduler:`` keys you read;
others set by the user are reported as unused) and ``reserves_full_sequence`` (True if your
admission reserves KV for the prompt and every output token, so nothing is ever preempted).

**You read** ``self.config`` (the ``scheduler:`` block; ``config.options`` holds free-form
settings for policies written elsewhere), ``self.waiting`` (a deque, arrival order; the
front is the head), ``self.running`` (a list, admission order), ``self.swapped`` (preempted
to host memory, resume order), ``self.kv_cache`` (``num_free_blocks``, ``block_size``,
``usage``), ``self.max_num_seqs`` and ``self.end_of_input`` (no further arrival is known). A
:class:`~batchsim.engine.request.Request` tells ``num_prompt_tokens``, ``max_tokens``,
``num_computed_tokens`` (tokens whose KV is cached), ``num_output_tokens``,
``num_remaining_tokens`` (known tokens not yet computed: the prompt, or 1 for a decode) and
``arrival_time``. Do not assign a request's fields or the queues' members yourself: use:

**You may call** (:mod:`.toolkit`):

- ``admit_waiting(request, token_budget, *, chunked=False)`` — admit the head of the waiting
  queue if the budget and the KV cache (above its watermark) allow; returns the tokens it
  computes now (its whole prompt, or with ``chunked=True`` what the budget allows, after the
  tokens found in the prefix cache), 0 if not admitted (nothing changed).
- ``schedule_running(token_budget, preempted)`` — every running request in order: a decode
  takes one token, an unfinished prompt a chunk; KV blocks are taken, preempting the most
  recently admitted when they run short (appended to ``preempted``). Returns
  ``(requests, tokens, budget left)``.
- ``schedule_swapped(token_budget, requests, tokens)`` — resume swapped requests, oldest
  first, while the batch cap, the budget and the KV cache allow; returns the budget left.
- ``allocate_or_preempt(request, num_tokens, preempted)``, ``preempt(request)`` (by
  recompute, or by swap with ``preemption_mode: swap``) and ``admit(request)``.
- ``make_output(requests, num_tokens, *, preempted=...)`` — the iteration to return (its
  :class:`~batchsim.cost.BatchShape` is computed from the requests; options pad prompts or
  keep empty slots for request-level batching).

An empty output (``make_output([], [])``) means nothing is runnable: the engine sleeps until
the next arrival, cancellation or your :meth:`~Scheduler.next_timer`.

**The engine checks** a policy written outside batchsim at every call: an exception it
raises, a request scheduled that is not running, a token count that is not an integer >= 1
or more than a request has left, tokens without KV blocks, a timer not in the future, or no
progress stops the run with one line naming the policy and the rule it broke (exit code 2).

**Use it** by name as ``scheduler: {policy: package.module:Class}`` (the module must be
importable), or register a built-in one in :mod:`batchsim.scheduler.registry`.

**Fast-forward** is a promise a policy may make, and is off unless it does
(:mod:`batchsim.scheduler.fast_forward`): a policy that declares nothing is asked at every
iteration, which is always correct.
"""

from __future__ import annotations

from typing import ClassVar

from mypy_extensions import mypyc_attr

from batchsim.engine.request import Request
from batchsim.scheduler.cohorts import CohortScheduling
from batchsim.scheduler.output import SchedulerOutput


@mypyc_attr(allow_interpreted_subclasses=True)
class Scheduler(CohortScheduling):
    """Base class of batching policies (see the module docstring).

    Args:
        config: The ``scheduler:`` block.
        kv_cache: The engine's block pool.
        window: Sliding-window length of the model (keys per query), or None.
        max_model_len: Longest sequence (prompt + output) the engine accepts, or None.
    """

    name: ClassVar[str] = ""
    """The policy's name in ``scheduler.policy`` (built-in policies)."""
    abstract_methods: ClassVar[tuple[str, ...]] = ("schedule",)
    """The methods a policy must define (:func:`~batchsim.scheduler.registry.load_policy`
    refuses a class that does not). Not an ``abc.ABC``: the compiled build compiles this class,
    and a compiled class with a Python base would hold its subclasses' ``__dict__`` and weak
    references in a layout of its own."""

    def schedule(self, now: float) -> SchedulerOutput:
        """The next iteration at simulated time ``now`` (s): which requests run and how many
        tokens each computes, built with :meth:`make_output`; an empty output when nothing
        is runnable. Arrivals up to ``now`` are already in ``waiting``."""
        raise NotImplementedError(f"{type(self).__qualname__} does not implement schedule()")

    def next_timer(self, now: float) -> float | None:
        """A future time at which :meth:`schedule` may decide differently without an arrival
        (dynamic batching's max delay), or None. Asked when an iteration came back empty."""
        return None

    def policy_reject_reason(self, request: Request) -> str:
        """Why ``request`` can never run under this policy ('' = accept), asked at its
        arrival after the engine's own checks (its length, the KV cache)."""
        return ""

    def on_request_left(self, request: Request) -> None:
        """``request`` finished or was cancelled (request-level policies track their
        batch's slots with it)."""
