"""The slot loop's host protocol: what a host receives each round (`SlotEvents`) and answers
(`SlotInjection`), the checks an answer passes before the loop executes it, and the Python side of
the loop's callbacks: a registry of live sessions, found by an id the jitted loop carries as an
operand (`registered`), the round's callback target (`call_host`) and the reads of the injected
tokens (`host_reader`). The loop itself is `loop.py`; what crosses per round, `host_transfer.py`.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from matpo_jax.sampler.host_transfer import HostTraffic, nbytes, unpack_rows

# Why a slot stopped (SlotEvents.stop_reason). STOP_NONE marks rows that did not stop.
STOP_NONE, STOP_EOS, STOP_IM_END, STOP_TOOL_CALL, STOP_TURN_CAP, STOP_CACHE_FULL = range(6)
STOP_REASON_NAMES = {STOP_NONE: "none", STOP_EOS: "eos", STOP_IM_END: "im_end",
                     STOP_TOOL_CALL: "tool_call", STOP_TURN_CAP: "turn_cap",
                     STOP_CACHE_FULL: "cache_full"}


class SlotProtocolError(ValueError):
    """The host answered with something the loop cannot execute; the message names the field."""


# ----------------------------------------------------------------------------- the host protocol


@dataclass
class SlotEvents:
    """Loop -> host, numpy arrays over the B slots. Rows with stopped=False are to be ignored
    (their turn_tokens / turn_logprobs are zeros: only stopped turns cross to the host)."""

    stopped: np.ndarray  # bool[B]
    stop_reason: np.ndarray  # int32[B], STOP_*
    turn_tokens: np.ndarray  # int32[B, max_turn]: sampled this turn, incl. the stop token
    turn_logprobs: np.ndarray  # float32[B, max_turn]
    turn_len: np.ndarray  # int32[B]
    cache_len: np.ndarray  # int32[B]: tokens in the slot's KV cache (sampled ones included)

    def turn(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """The (tokens, logprobs) a slot sampled in the turn that just ended."""
        n = int(self.turn_len[slot])
        return self.turn_tokens[slot, :n].copy(), self.turn_logprobs[slot, :n].copy()


@dataclass
class SlotInjection:
    """Host -> loop. tokens [B, K] with K <= max_len: only the columns the injection's extends
    read cross to the device (see the module docstring)."""

    tokens: np.ndarray  # int32[B, K]: non-trainable tokens appended to the slot
    num: np.ndarray  # int32[B]: how many of tokens[b] to append (0 = nothing)
    reset: np.ndarray  # bool[B]: cache length set to 0 before writing (a new sequence)
    active: np.ndarray  # bool[B]: the slot decodes on afterwards (False = idle)
    done: bool = False  # end the loop
    # int32[B] or None: a reset slot starts from run_slots' prefixes[prefix[b]] (its cached keys
    # and values) and `tokens` are appended after it; -1 = no prefix.
    prefix: np.ndarray | None = None
    # int32[B] or None: the token cap of the turn a slot starts after this injection (one that
    # receives tokens or stopped); 0 = max_turn, the default. E.g. a shorter final-summary turn.
    turn_cap: np.ndarray | None = None
    # int32[B] or None: the sampling stream a slot's draws use from now on (-1 = keep its own):
    # each draw's key is (rng, stream, cache position of the token), so a sequence given the
    # same stream samples the same tokens in any slot and next to any other sequences. A slot
    # never given one uses its row index.
    stream: np.ndarray | None = None
    # int32[B] or None: the sampling profile a slot decodes with from now on (-1 = keep; a slot
    # starts with 0): an index into run_slots' profiles (0 = `sampling`, 1.. = `more_profiles`),
    # e.g. the worker's temperature, top-p and stop ids in the planner's decode batch.
    profile: np.ndarray | None = None

    @classmethod
    def nothing(cls, slots: int, width: int = 1) -> "SlotInjection":
        """An injection that writes nothing and leaves every slot idle; hosts fill it in place."""
        return cls(tokens=np.zeros((slots, width), np.int32), num=np.zeros(slots, np.int32),
                   reset=np.zeros(slots, bool), active=np.zeros(slots, bool), done=False,
                   prefix=np.full(slots, -1, np.int32), turn_cap=np.zeros(slots, np.int32),
                   stream=np.full(slots, -1, np.int32), profile=np.full(slots, -1, np.int32))


class SlotHost(Protocol):
    def __call__(self, events: SlotEvents) -> SlotInjection: ...


class SlotLoopStats(NamedTuple):
    decode_steps: int  # loop iterations that decoded a token
    host_calls: int
    sampled_tokens: int
    hit_limit: bool  # stopped by the max_steps / max_host_calls safety caps, not by the host
    # (bytes device -> host, bytes host -> device) of each host round, measured on the arrays
    # that crossed (the round's injection reads included).
    round_bytes: tuple[tuple[int, int], ...] = ()

    @property
    def bytes_to_host(self) -> int:
        return sum(r[0] for r in self.round_bytes)

    @property
    def bytes_from_host(self) -> int:
        return sum(r[1] for r in self.round_bytes)


def chat_stop_ids(chat_format) -> dict[int, int]:
    """Stop ids of a ChatFormat (eos_id, im_end_id, tool_call_end_id attributes) -> reasons.

    When eos and <|im_end|> are the same id (Qwen3 instruct), the turn end wins: STOP_IM_END.
    """
    table = {}
    for attribute, reason in (("eos_id", STOP_EOS), ("im_end_id", STOP_IM_END),
                              ("tool_call_end_id", STOP_TOOL_CALL)):
        token_id = getattr(chat_format, attribute, None)
        if token_id is not None:
            table[int(token_id)] = reason
    return table


def stop_table(stop_ids: Mapping[int, int] | Sequence[int]) -> tuple[tuple[int, int], ...]:
    """A hashable, sorted ((token_id, reason), ...) from a mapping or a plain id list (-> EOS)."""
    if isinstance(stop_ids, Mapping):
        pairs = {int(t): int(r) for t, r in stop_ids.items()}
    else:
        pairs = {int(t): STOP_EOS for t in stop_ids}
    for token_id, reason in pairs.items():
        if reason not in (STOP_EOS, STOP_IM_END, STOP_TOOL_CALL):
            raise SlotProtocolError(f"stop_ids[{token_id}] must be STOP_EOS/IM_END/TOOL_CALL, "
                                    f"got {reason}")
    return tuple(sorted(pairs.items()))


# ----------------------------------------------------------------------------- the callbacks' host side


class HostSession:
    """A live run_slots call: its host, shapes for validation, the tokens of the current
    injection (read by the loop's extends), the traffic so far, and the first host error."""

    def __init__(self, host: SlotHost, slots: int, max_len: int, max_turn: int,
                 prefix_lengths=(), profiles: int = 1):
        self.host, self.slots, self.max_len, self.max_turn = host, slots, max_len, max_turn
        self.profiles = profiles
        self.prefix_lengths = np.asarray(prefix_lengths, np.int32)
        self.tokens = np.zeros((slots, 0), np.int32)
        self.traffic = HostTraffic()
        self.error: BaseException | None = None


_SESSIONS: dict[int, HostSession] = {}
_SESSION_IDS = itertools.count(1)
_SESSIONS_LOCK = threading.Lock()


@contextlib.contextmanager
def registered(session: HostSession):
    """The id under which the loop's callbacks find `session` (an operand of the jitted loop, so
    that every host shares one compilation), for as long as the loop runs."""
    with _SESSIONS_LOCK:
        session_id = next(_SESSION_IDS)
        _SESSIONS[session_id] = session
    try:
        yield session_id
    finally:
        with _SESSIONS_LOCK:
            del _SESSIONS[session_id]


def call_host(session_id, stopped, stop_reason, turn_len, cache_len, flat_tokens,
               flat_logprobs):
    """The round's io_callback target: unpacks the stopped turns, runs the host and turns its
    answer into fixed-shape control arrays (its tokens stay here for `read_tokens`).

    A host exception must not unwind through XLA (it would surface as an opaque runtime error), so
    it is stored, the loop is told `done`, and run_slots re-raises it.
    """
    session = _SESSIONS[int(session_id)]
    session.traffic.start_round(nbytes(session_id, stopped, stop_reason, turn_len, cache_len,
                                       flat_tokens, flat_logprobs))
    stopped = np.asarray(stopped, bool)
    turn_len = np.asarray(turn_len)
    counts = np.where(stopped, turn_len, 0)
    events = SlotEvents(stopped=stopped, stop_reason=np.asarray(stop_reason),
                        turn_tokens=unpack_rows(np.asarray(flat_tokens), counts, session.max_turn),
                        turn_logprobs=unpack_rows(np.asarray(flat_logprobs), counts,
                                                  session.max_turn),
                        turn_len=turn_len, cache_len=np.asarray(cache_len))
    answer = None
    if session.error is None:
        try:
            answer = check_injection(session.host(events), events, session)
        except BaseException as error:  # noqa: BLE001 - re-raised by run_slots
            session.error = error
    if answer is None:
        finish = SlotInjection.nothing(session.slots)
        answer = (finish.tokens, finish.num, finish.reset, finish.active, finish.prefix,
                  finish.turn_cap, finish.stream, finish.profile, np.bool_(True))
    session.tokens = answer[0]
    control = answer[1:]
    session.traffic.add(0, nbytes(*control))
    return control


def read_tokens(session_id, rows, start, *, width: int):
    """An extend's io_callback target: columns [start, start + width) of the current injection's
    rows (row index B, an empty lane, reads zeros)."""
    session = _SESSIONS[int(session_id)]
    rows, start = np.asarray(rows), int(start)
    out = np.zeros((len(rows), width), np.int32)
    present = rows < session.slots
    part = session.tokens[rows[present], start:start + width]
    out[np.flatnonzero(present), :part.shape[1]] = part
    session.traffic.add(nbytes(session_id, rows, np.int32(start)), out.nbytes)
    return out


def host_reader(session_id, replicated=lambda x: x):
    """writes.inject's `read_tokens` for host injections: one callback per extend."""

    def read(rows, start, width):
        tokens = io_callback(functools.partial(read_tokens, width=width),
                             jax.ShapeDtypeStruct((rows.shape[0], width), jnp.int32),
                             session_id, *replicated((rows.astype(jnp.int32), jnp.int32(start))),
                             ordered=True)
        return replicated(tokens)
    return read


def check_injection(injection, events: SlotEvents, session: HostSession):
    """The host's answer as the callback returns it, after checking every field against the
    loop's shapes and limits (SlotProtocolError names the field and the slot)."""
    slots, max_len = session.slots, session.max_len
    if not isinstance(injection, SlotInjection):
        raise SlotProtocolError(f"the host must return a SlotInjection, got {type(injection)}")

    def field(name, dtype, shape):
        value = np.asarray(getattr(injection, name))
        if value.shape != shape:
            raise SlotProtocolError(f"SlotInjection.{name} must have shape {shape}, got {value.shape}")
        return value.astype(dtype)

    num = field("num", np.int32, (slots,))
    reset = field("reset", bool, (slots,))
    active = field("active", bool, (slots,))
    tokens = np.asarray(injection.tokens)
    if tokens.ndim != 2 or tokens.shape[0] != slots or tokens.shape[1] > max_len:
        raise SlotProtocolError(
            f"SlotInjection.tokens must have shape [{slots}, K <= {max_len}], got {tokens.shape}")
    tokens = np.ascontiguousarray(tokens, np.int32)
    prefix = (np.full(slots, -1, np.int32) if injection.prefix is None
              else field("prefix", np.int32, (slots,)))
    known = len(session.prefix_lengths)
    for slot in np.flatnonzero((prefix < -1) | (prefix >= known))[:1]:
        raise SlotProtocolError(f"SlotInjection.prefix[{slot}]={prefix[slot]} is outside "
                                f"[-1, {known}) (run_slots got {known} prefixes)")
    for slot in np.flatnonzero((prefix >= 0) & ~reset)[:1]:
        raise SlotProtocolError(f"SlotInjection.prefix[{slot}] is set but reset[{slot}] is not: "
                                "only a new sequence can start from a prefix")
    turn_cap = (np.zeros(slots, np.int32) if injection.turn_cap is None
                else field("turn_cap", np.int32, (slots,)))
    for slot in np.flatnonzero((turn_cap < 0) | (turn_cap > session.max_turn))[:1]:
        raise SlotProtocolError(f"SlotInjection.turn_cap[{slot}]={turn_cap[slot]} is outside "
                                f"[0, {session.max_turn}] (0 = max_turn)")
    start = np.where(reset, 0, events.cache_len)
    if known:
        start = np.where(prefix >= 0, session.prefix_lengths[np.maximum(prefix, 0)], start)
    for slot in np.flatnonzero((num < 0) | (num > tokens.shape[1]))[:1]:
        raise SlotProtocolError(f"SlotInjection.num[{slot}]={num[slot]} is outside "
                                f"[0, {tokens.shape[1]}] (the width of tokens)")
    for slot in np.flatnonzero(start + num > max_len)[:1]:
        raise SlotProtocolError(
            f"SlotInjection.num[{slot}]={num[slot]} overflows slot {slot}: it holds "
            f"{start[slot]} tokens and the cache has max_len={max_len}")
    for slot in np.flatnonzero(active & (start + num == 0))[:1]:
        raise SlotProtocolError(f"SlotInjection.active[{slot}] is set but the slot is empty")
    stream = (np.full(slots, -1, np.int32) if injection.stream is None
              else field("stream", np.int32, (slots,)))
    for slot in np.flatnonzero(stream < -1)[:1]:
        raise SlotProtocolError(f"SlotInjection.stream[{slot}]={stream[slot]} is negative "
                                "(-1 keeps the slot's stream)")
    profile = (np.full(slots, -1, np.int32) if injection.profile is None
               else field("profile", np.int32, (slots,)))
    for slot in np.flatnonzero((profile < -1) | (profile >= session.profiles))[:1]:
        raise SlotProtocolError(f"SlotInjection.profile[{slot}]={profile[slot]} is outside "
                                f"[-1, {session.profiles}) (run_slots got {session.profiles} "
                                "sampling profiles)")
    return (tokens, num, reset, active, prefix, turn_cap, stream, profile,
            np.bool_(injection.done))
