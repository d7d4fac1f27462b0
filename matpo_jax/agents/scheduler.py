"""The slot host: which sequence sits in which decode slot, and when it gets one.

The sampler's loop (`sampler.run_slots`) owns B decode slots and calls the host whenever slots
stop. This host knows nothing about agents or tools. On every call it hands the stopped
sequences' turns (maybe none) to `on_turns`, which answers per sequence:
- `Continue(tokens)`: append these (non-trainable) tokens in place and decode on;
- `RELEASE`: the sequence is finished and leaves its slot;
- `PARK`: the sequence waits (a planner on its workers, an agent on a background tool call). It
  stops decoding, and its tokens are kept on the host. Its slot keeps the KV cache only while
  nobody else needs the slot: a waiting sequence with no free slot evicts a parked one. So no
  sequence ever waits behind a parked one.

Waiting sequences (new ones, parked ones whose wait is over) are queued with
`admit(seq_id, context)`, `context` being the sequence's whole token list. A parked sequence still
in its slot resumes in place (only the new suffix is written); any other takes a free slot, which
is reset and prefilled with the whole context, or, when the context starts with one of the
registered `prefixes`, started from that prefix's cached keys and values and prefilled with the
rest.

`mix_roles=False` is the baseline the benchmark compares against: sequences of one group (role)
decode at a time, and the next group starts only when the current one has no active slot left.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Callable, Hashable, Sequence

import numpy as np

from matpo_jax import sampler


@dataclasses.dataclass(frozen=True)
class Turn:
    """What one sequence sampled since it last received tokens."""

    seq_id: int
    tokens: list[int]  # incl. the stop token, if any
    logprobs: list[float]
    stop_reason: int  # sampler.STOP_*
    cache_len: int  # tokens now in the sequence's KV cache


@dataclasses.dataclass(frozen=True)
class Continue:
    """Append `tokens` (non-trainable) to the sequence in its slot, then decode on, for at most
    `turn_cap` tokens (0: the loop's per-turn cap)."""

    tokens: list[int]
    turn_cap: int = 0


class _Signal:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


RELEASE = _Signal("RELEASE")  # finished: the slot is free
PARK = _Signal("PARK")  # waiting: the slot keeps its cache until someone needs it

Decision = Continue | _Signal
TurnHandler = Callable[[Sequence[Turn]], "dict[int, Decision]"]


@dataclasses.dataclass
class SchedulerStats:
    host_calls: int = 0
    prefills: int = 0  # admissions into a reset slot (first prompts and re-prefills)
    prefill_tokens: int = 0  # tokens those admissions wrote
    injected_tokens: int = 0  # tokens appended in place (tool responses, resumed contexts...)
    resumed_in_place: int = 0  # parked sequences that found their cache still in their slot
    evictions: int = 0  # parked sequences whose slot was given to a waiting one
    # Per host call, the token counts written into the slots that receive any, in slot order.
    injection_lengths: list[list[int]] = dataclasses.field(default_factory=list)
    prefix_hits: int = 0  # admissions that started from a registered prefix
    prefix_tokens: int = 0  # prompt tokens those admissions did not have to prefill


@dataclasses.dataclass(order=True)
class _Waiting:
    priority: int
    arrival: int
    seq_id: int = dataclasses.field(compare=False)
    context: list[int] = dataclasses.field(compare=False)
    group: Hashable = dataclasses.field(compare=False)
    turn_cap: int = dataclasses.field(default=0, compare=False)
    stream: int = dataclasses.field(default=-1, compare=False)
    profile: int = dataclasses.field(default=-1, compare=False)


@dataclasses.dataclass
class _Slot:
    seq_id: int | None = None
    parked: bool = False
    cached: int = 0  # tokens of seq_id in this slot's KV cache (valid while parked)
    parked_at: int = 0  # host call at which it parked (the oldest is evicted first)

    @property
    def active(self) -> bool:
        return self.seq_id is not None and not self.parked


class SlotScheduler:
    """Implements the `sampler.SlotHost` protocol over an agent-agnostic turn handler."""

    def __init__(self, num_slots: int, injection_len: int, on_turns: TurnHandler, *,
                 mix_roles: bool = True, group_order: Sequence[Hashable] = (),
                 on_idle: Callable[[], bool] | None = None):
        self.num_slots = num_slots
        # Called when no slot would decode and nobody waits: blocks until the owner has queued
        # more work (e.g. a slow tool call came back) and returns True, or returns False if it
        # has nothing pending (then the loop ends).
        self.on_idle = on_idle
        self.prefixes: list[list[int]] = []  # run_slots(prefixes=...) must get this very list
        # The sampling profile of the sequences each prefix starts: a sequence starts only from a
        # prefix of its own profile (with LoRA, the profile's role adapter computed its keys).
        self.prefix_profiles: list[int] = []
        self.injection_len = injection_len
        self.on_turns = on_turns
        self.mix_roles = mix_roles
        self.group_order = list(group_order)
        self.slots = [_Slot() for _ in range(num_slots)]
        self._waiting: list[_Waiting] = []
        self._arrivals = itertools.count()
        self._phase: Hashable = None  # the group allowed to decode (mix_roles=False only)
        self.stats = SchedulerStats()

    # -- queue -------------------------------------------------------------------------------
    def admit(self, seq_id: int, context: Sequence[int], group: Hashable = None,
              priority: int = 0, turn_cap: int = 0, stream: int = -1, profile: int = -1) -> None:
        """Queues a sequence to decode on from `context` (its whole token list), for a turn of
        at most `turn_cap` tokens (0: the loop's per-turn cap). stream: the sequence's sampling
        stream (SlotInjection.stream), given to whichever slot it lands in; -1: the slot's own.
        profile: its sampling profile (SlotInjection.profile), set on the slot it lands in; -1:
        profile 0 (a slot keeps its profile while its sequence resumes in place)."""
        if len(context) > self.injection_len:
            raise ValueError(f"sequence {seq_id}: context of {len(context)} tokens exceeds the "
                             f"injection buffer ({self.injection_len})")
        if group not in self.group_order:
            self.group_order.append(group)
        heapq.heappush(self._waiting, _Waiting(priority, next(self._arrivals), seq_id,
                                               list(context), group, turn_cap, stream,
                                               profile))

    def register_prefix(self, tokens: Sequence[int], profile: int = 0) -> None:
        """Declares a token prefix that admitted contexts of sampling profile `profile` may start
        with (before the loop runs)."""
        tokens = list(tokens)
        if tokens and (tokens, profile) not in zip(self.prefixes, self.prefix_profiles):
            self.prefixes.append(tokens)
            self.prefix_profiles.append(profile)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def slot_seq(self) -> list[int | None]:
        """The sequence whose tokens each slot holds (decoding or parked)."""
        return [s.seq_id for s in self.slots]

    @property
    def num_active(self) -> int:
        return sum(s.active for s in self.slots)

    # -- host protocol -----------------------------------------------------------------------
    def __call__(self, events: sampler.SlotEvents) -> sampler.SlotInjection:
        self.stats.host_calls += 1
        writes: dict[int, list[int]] = {}  # slot -> tokens to append
        reset = np.zeros(self.num_slots, bool)
        prefix = np.full(self.num_slots, -1, np.int32)
        turn_cap = np.zeros(self.num_slots, np.int32)
        stream = np.full(self.num_slots, -1, np.int32)
        profile = np.full(self.num_slots, -1, np.int32)
        turns = self._collect_turns(events)
        # Called on every host call, even with no turns: an owner with work in flight (tool
        # calls) queues what has come back.
        decisions = self.on_turns([turn for _, turn in turns])
        for index, turn in turns:
            decision = decisions.get(turn.seq_id, RELEASE)
            slot = self.slots[index]
            if decision is RELEASE:
                self.slots[index] = _Slot()
            elif decision is PARK:
                slot.parked, slot.cached = True, turn.cache_len
                slot.parked_at = self.stats.host_calls
            else:
                writes[index] = list(decision.tokens)
                turn_cap[index] = decision.turn_cap
                self.stats.injected_tokens += len(decision.tokens)
        placed = self._place_waiting()
        while not self.num_active and self.on_idle is not None and self.on_idle():
            placed += self._place_waiting()
        for index, tokens, fresh, cap, seq_stream, seq_profile in placed:
            reset[index] = fresh
            turn_cap[index] = cap
            if fresh:
                stream[index] = seq_stream
                profile[index] = max(seq_profile, 0)
                prefix[index], skipped = self._prefix_of(tokens, max(seq_profile, 0))
                tokens = tokens[skipped:]
                self.stats.prefills += 1
                self.stats.prefill_tokens += len(tokens)
                self.stats.prefix_hits += skipped > 0
                self.stats.prefix_tokens += skipped
            else:
                self.stats.resumed_in_place += 1
                self.stats.injected_tokens += len(tokens)
            writes[index] = tokens
        return self._injection(writes, reset, prefix, turn_cap, stream, profile)

    def _prefix_of(self, context: list[int], profile: int = 0) -> tuple[int, int]:
        """(index of the longest registered prefix of `profile` the context starts with, its
        length), or (-1, 0)."""
        matches = [i for i, (p, owner) in enumerate(zip(self.prefixes, self.prefix_profiles))
                   if owner == profile and context[:len(p)] == p]
        if not matches:
            return -1, 0
        best = max(matches, key=lambda i: len(self.prefixes[i]))
        return best, len(self.prefixes[best])

    def _collect_turns(self, events) -> list[tuple[int, Turn]]:
        turns = []
        for index in np.flatnonzero(np.asarray(events.stopped, bool)):
            slot = self.slots[index]
            if not slot.active:  # an idle slot reported by the loop's first call
                continue
            tokens, logprobs = events.turn(int(index))
            turns.append((int(index), Turn(
                seq_id=slot.seq_id, tokens=[int(t) for t in tokens],
                logprobs=[float(x) for x in logprobs],
                stop_reason=int(events.stop_reason[index]),
                cache_len=int(events.cache_len[index]))))
        return turns

    def _place_waiting(self) -> list[tuple[int, list[int], bool, int, int, int]]:
        """Gives waiting sequences somewhere to decode: in place if still parked in a slot, else
        a free slot, else the slot of the longest-parked sequence that is not itself waiting.
        Returns (slot, tokens to write, whether the slot is reset first, turn cap, stream,
        profile)."""
        if not self.mix_roles:
            self._advance_phase()
        parked_in = {s.seq_id: i for i, s in enumerate(self.slots) if s.parked}
        placed, deferred = [], []
        while self._waiting:
            entry = heapq.heappop(self._waiting)
            if not self.mix_roles and entry.group != self._phase:
                deferred.append(entry)
                continue
            index = parked_in.pop(entry.seq_id, None)
            if index is not None:  # its cache is still there: write only what is new
                slot = self.slots[index]
                slot.parked = False
                placed.append((index, entry.context[slot.cached:], False, entry.turn_cap,
                               entry.stream, entry.profile))
                continue
            index = self._free_slot(waiting={e.seq_id for e in self._waiting})
            if index is None:
                deferred.append(entry)
                break
            self.slots[index] = _Slot(seq_id=entry.seq_id)
            placed.append((index, entry.context, True, entry.turn_cap, entry.stream,
                           entry.profile))
        for entry in deferred:
            heapq.heappush(self._waiting, entry)
        return placed

    def _free_slot(self, waiting: set[int]) -> int | None:
        for index, slot in enumerate(self.slots):
            if slot.seq_id is None:
                return index
        parked = [(s.parked_at, i) for i, s in enumerate(self.slots)
                  if s.parked and s.seq_id not in waiting]
        if not parked:
            return None
        _, index = min(parked)
        self.stats.evictions += 1  # its owner will be re-prefilled when it comes back
        return index

    def _advance_phase(self) -> None:
        """Baseline: switch to the next group with waiting sequences once no slot decodes."""
        if self.num_active or not self._waiting:
            return
        waiting_groups = {entry.group for entry in self._waiting}
        if self._phase is not None and self._phase in waiting_groups:
            return
        order = self.group_order
        start = order.index(self._phase) + 1 if self._phase in order else 0
        for k in range(len(order)):
            group = order[(start + k) % len(order)]
            if group in waiting_groups:
                self._phase = group
                return

    def _injection(self, writes: dict[int, list[int]], reset: np.ndarray, prefix: np.ndarray,
                   turn_cap: np.ndarray, stream: np.ndarray, profile: np.ndarray):
        self.stats.injection_lengths.append([len(writes[i]) for i in sorted(writes) if writes[i]])
        width = max([1] + [len(ids) for ids in writes.values()])
        tokens = np.zeros((self.num_slots, width), np.int32)
        num = np.zeros(self.num_slots, np.int32)
        for index, ids in writes.items():
            if len(ids) > self.injection_len:
                raise ValueError(f"slot {index}: {len(ids)} tokens to inject exceed the "
                                 f"injection buffer ({self.injection_len})")
            tokens[index, :len(ids)] = ids
            num[index] = len(ids)
        active = np.array([s.active for s in self.slots])
        if not active.any() and self._waiting:
            raise RuntimeError(f"{len(self._waiting)} sequences wait but none can be placed")
        return sampler.SlotInjection(tokens=tokens, num=num, reset=reset, active=active,
                                      done=bool(not active.any()), prefix=prefix,
                                      turn_cap=turn_cap, stream=stream, profile=profile)
