"""The slot host: which sequence sits in which decode slot, and when it gets one.

The sampler's loop (`sampling.run_slots`) owns B decode slots and calls the host whenever slots
stop. This host knows nothing about agents or tools. It hands every stopped sequence's turn to
`on_turns`, which answers per sequence either `Continue(tokens)` (append these non-trainable tokens
in place and decode on) or `RELEASE` (the sequence leaves its slot: finished, or suspended with its
tokens kept on the host). Sequences waiting for a slot (new ones, or suspended ones coming back)
are queued with `admit(seq_id, context)`; a free slot takes them by resetting its cache and
prefilling the whole context. So a planner waiting on its workers holds no slot.

`mix_roles=False` is the baseline the benchmark compares against: sequences of one group (role)
run at a time, and the next group starts only when the current one has drained its slots.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Callable, Hashable, Sequence

import numpy as np

from matpo_jax import sampling


@dataclasses.dataclass(frozen=True)
class Turn:
    """What one sequence sampled since it last received tokens."""

    seq_id: int
    tokens: list[int]  # incl. the stop token, if any
    logprobs: list[float]
    stop_reason: int  # sampling.STOP_*
    cache_len: int  # tokens now in the sequence's KV cache


@dataclasses.dataclass(frozen=True)
class Continue:
    """Append `tokens` (non-trainable) to the sequence in its slot, then decode on."""

    tokens: list[int]


RELEASE = None  # the sequence leaves its slot

TurnHandler = Callable[[Sequence[Turn]], "dict[int, Continue | None]"]


@dataclasses.dataclass
class SchedulerStats:
    host_calls: int = 0
    sampled_tokens: int = 0  # busy slot-steps: every active slot samples one token per step
    decode_steps: int = 0  # loop iterations, reconstructed from turn lengths
    prefill_tokens: int = 0  # tokens written by admissions (first prompts and re-prefills)
    injected_tokens: int = 0  # tokens appended in place (tool responses, headers...)
    admissions: int = 0
    releases: int = 0

    def utilisation(self, num_slots: int) -> float:
        total = num_slots * self.decode_steps
        return self.sampled_tokens / total if total else 0.0


@dataclasses.dataclass(order=True)
class _Waiting:
    priority: int
    arrival: int
    seq_id: int = dataclasses.field(compare=False)
    context: list[int] = dataclasses.field(compare=False)
    group: Hashable = dataclasses.field(compare=False)


class SlotScheduler:
    """Implements the `sampling.SlotHost` protocol over an agent-agnostic turn handler."""

    def __init__(self, num_slots: int, injection_len: int, on_turns: TurnHandler, *,
                 mix_roles: bool = True, group_order: Sequence[Hashable] = ()):
        self.num_slots = num_slots
        self.injection_len = injection_len
        self.on_turns = on_turns
        self.mix_roles = mix_roles
        self.group_order = list(group_order)
        self.slot_seq: list[int | None] = [None] * num_slots
        self._waiting: list[_Waiting] = []
        self._arrivals = itertools.count()
        self._phase: Hashable = None  # the group allowed to run (mix_roles=False only)
        # Decode-step clock: a slot that (re)starts a turn at step t and stops after n sampled
        # tokens stops at step t + n, so the clock follows from the events alone.
        self._turn_start = np.zeros(num_slots, np.int64)
        self.stats = SchedulerStats()

    # -- queue -------------------------------------------------------------------------------
    def admit(self, seq_id: int, context: Sequence[int], group: Hashable = None,
              priority: int = 0) -> None:
        """Queues a sequence for a free slot; it will be prefilled with `context` (its whole cache)."""
        if len(context) > self.injection_len:
            raise ValueError(f"sequence {seq_id}: context of {len(context)} tokens exceeds the "
                             f"injection buffer ({self.injection_len})")
        if group not in self.group_order:
            self.group_order.append(group)
        heapq.heappush(self._waiting, _Waiting(priority, next(self._arrivals), seq_id,
                                               list(context), group))

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_busy(self) -> int:
        return sum(s is not None for s in self.slot_seq)

    # -- host protocol -----------------------------------------------------------------------
    def __call__(self, events: sampling.SlotEvents) -> sampling.SlotInjection:
        self.stats.host_calls += 1
        writes: dict[int, list[int]] = {}  # slot -> tokens to append
        turns, slot_of = self._collect_turns(events)
        decisions = self.on_turns(turns) if turns else {}
        for turn in turns:
            slot = slot_of[turn.seq_id]
            decision = decisions.get(turn.seq_id, RELEASE)
            if decision is RELEASE:
                self.slot_seq[slot] = None
                self.stats.releases += 1
            else:
                writes[slot] = list(decision.tokens)
                self.stats.injected_tokens += len(decision.tokens)
                self._turn_start[slot] = self.stats.decode_steps
        reset = np.zeros(self.num_slots, bool)
        for slot, context in self._fill_free_slots():
            writes[slot] = context
            reset[slot] = True
            self.stats.prefill_tokens += len(context)
            self._turn_start[slot] = self.stats.decode_steps

        width = max([1] + [len(ids) for ids in writes.values()])
        tokens = np.zeros((self.num_slots, width), np.int32)
        num = np.zeros(self.num_slots, np.int32)
        for slot, ids in writes.items():
            if len(ids) > self.injection_len:
                raise ValueError(f"slot {slot}: {len(ids)} tokens to inject exceed the injection "
                                 f"buffer ({self.injection_len})")
            tokens[slot, :len(ids)] = ids
            num[slot] = len(ids)
        active = np.array([seq is not None for seq in self.slot_seq])
        return sampling.SlotInjection(tokens=tokens, num=num, reset=reset, active=active,
                                      done=bool(not active.any()))

    def _collect_turns(self, events) -> tuple[list[Turn], dict[int, int]]:
        stopped = np.asarray(events.stopped, bool)
        turn_len = np.asarray(events.turn_len)
        turns, slot_of = [], {}
        for slot in np.flatnonzero(stopped):
            seq_id = self.slot_seq[slot]
            if seq_id is None:  # an idle slot reported by the loop's first call
                continue
            n = int(turn_len[slot])
            turns.append(Turn(
                seq_id=seq_id,
                tokens=[int(t) for t in np.asarray(events.turn_tokens)[slot, :n]],
                logprobs=[float(x) for x in np.asarray(events.turn_logprobs)[slot, :n]],
                stop_reason=int(np.asarray(events.stop_reason)[slot]),
                cache_len=int(np.asarray(events.cache_len)[slot])))
            slot_of[seq_id] = int(slot)
            self.stats.sampled_tokens += n
            self.stats.decode_steps = max(self.stats.decode_steps,
                                          int(self._turn_start[slot]) + n)
        return turns, slot_of

    def _fill_free_slots(self) -> list[tuple[int, list[int]]]:
        """Moves waiting sequences into free slots; returns (slot, context to prefill) pairs."""
        if not self.mix_roles:
            self._advance_phase()
        filled, skipped = [], []
        free = [s for s, seq in enumerate(self.slot_seq) if seq is None]
        while free and self._waiting:
            entry = heapq.heappop(self._waiting)
            if not self.mix_roles and entry.group != self._phase:
                skipped.append(entry)
                continue
            slot = free.pop(0)
            self.slot_seq[slot] = entry.seq_id
            self.stats.admissions += 1
            filled.append((slot, entry.context))
        for entry in skipped:
            heapq.heappush(self._waiting, entry)
        return filled

    def _advance_phase(self) -> None:
        """Baseline: switch to the next group with waiting sequences once all slots are free."""
        if self.num_busy or not self._waiting:
            return
        waiting_groups = {entry.group for entry in self._waiting}
        if self._phase in waiting_groups and self._phase is not None:
            return
        order = self.group_order
        start = order.index(self._phase) + 1 if self._phase in order else 0
        for k in range(len(order)):
            group = order[(start + k) % len(order)]
            if group in waiting_groups:
                self._phase = group
                return
