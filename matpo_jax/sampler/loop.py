"""The slot sampler: one jitted `lax.while_loop` that decodes B slots and talks to a Python host.

Each iteration samples one token per active slot and feeds it through `model.decode`. Whenever a
slot stops (a stop token, its turn cap, a full cache) the loop leaves XLA through an ordered
`io_callback`, hands every stopped slot's turn to the host (`SlotEvents`) and receives what to
write next (`SlotInjection`: prompts, tool responses, re-prefilled contexts). The injected tokens
are written inside the loop by `model.extend_last` of a static bucket width over only the rows that
receive tokens, a static number of lanes at a time (long ones by a loop of fixed-width chunks), so
a rollout with many tool calls is a single compiled program: no recompiles, no re-upload of the
cache, no Python per decoded token. Prompt prefixes that many sequences share are computed once
per loop and copied into the slots that start with them (see `writes.py`).

Structure: outer loop = [host call -> inject] then an inner loop that decodes until some slot
stops; the host is therefore called exactly once per iteration in which any slot stopped (and once
at the start). The jitted function does not close over the host: the callback finds it through a
registry keyed by an id that is a runtime argument, so all hosts share one compilation per
(model, slots, max_len, max_turn, buckets, stop ids, mesh, number of sampling profiles, top-k).
Temperatures and top-p masses are operands: a greedy evaluation and sampled rollouts of the same
shapes run one compiled loop (a loop with host callbacks is never in JAX's persistent cache, so
every process compiles it).

Host traffic of a round (`host_transfer.py`), proportional to the tokens that change hands:
  device -> host, one ordered callback: stopped, stop_reason, turn_len, cache_len ([B] each) and
    the stopped slots' turns packed flat (tokens int32 and log-probs float32, each row's first
    turn_len entries, row after row) at the smallest of `flat_widths(B * max_turn)` that holds
    them; the host unpacks them into SlotEvents' [B, max_turn] arrays (zeros in other rows).
  host -> device, the same callback's answer: num, reset, active, prefix, turn_cap, stream
    ([B] each) and done. The injected tokens stay on the host: each extend of the injection reads
    its rows' columns [start, start + width) through one more callback of its own static [rows, width]
    (`writes.inject`), so a round moves the positions its extends compute (rows = lanes, or B
    when lanes >= B; width = a bucket, or chunks of the last bucket), never [B, max_len].
SlotLoopStats.round_bytes reports what each round moved, measured on the arrays that crossed.

With a mesh (given, or the one the parameters are sharded over) the KV cache is sharded like
`parallel.cache_shardings` (slots over data x fsdp, kv heads over tensor), and so are the
per-slot logits and turn buffers (slots over data x fsdp); `capacity.py` says how many slots fit.
"""
from __future__ import annotations

import collections
import functools
from typing import Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from matpo_jax.model import paged_cache, paged_sharding
from matpo_jax.model.decoder import KVCache, init_cache
from matpo_jax.model.kernel_sharding import kernel_mesh
from matpo_jax.parallel.mesh import BATCH_AXES
from matpo_jax.parallel.partitioning import cache_shardings, fit_spec
from matpo_jax.sampler.capacity import paged_mesh_refusal
from matpo_jax.sampler.host_protocol import (STOP_CACHE_FULL, STOP_NONE, STOP_TURN_CAP,
                                             HostSession, SlotEvents, SlotHost, SlotInjection,
                                             SlotLoopStats, SlotProtocolError, call_host,
                                             host_reader, registered, stop_table)
from matpo_jax.sampler.host_transfer import flat_widths, pack_rows
from matpo_jax.sampler.ops import (ProfileValues, Sampling, Truncation, draw_keys,
                                   profile_settings, sample_with_profiles)
from matpo_jax.sampler.writes import (PrefixStore, build_paged_prefix_store, build_prefix_store,
                                      copy_prefixes, inject, prefix_store_shape, share_prefixes)

__all__ = ["Sampling", "PagedCache", "default_buckets", "default_lanes", "normalize_buckets",
           "mesh_of", "run_slots", "generate"]


class PagedCache(NamedTuple):
    """The loop's KV cache as pages (model/paged_cache.py) instead of slots x max_len: pages of
    `page_size` tokens (max_len must be a multiple), a pool of `num_pages` shared by the slots
    and the prompt prefixes (0: enough for every slot and prefix at max_len, never short). On a
    mesh that splits the slots over S batch shards, each shard has num_pages / S of them for its
    slots and its own copy of the prefixes (model/paged_sharding.py)."""
    page_size: int = 64
    num_pages: int = 0

    def pool(self, slots: int, prefix_rows: int, max_len: int, shards: int = 1) -> int:
        return self.num_pages or (slots + shards * prefix_rows) * (max_len // self.page_size)


def default_buckets(max_len: int) -> tuple[int, ...]:
    """Static injection widths: a short tool response pays for a 16- or 64-token extend. Anything
    longer than the last width (a prompt, a re-prefilled context) is written in chunks of it."""
    widths = tuple(b for b in (16, 64, 256, 512) if b < max_len)
    return widths + (max_len,) if max_len <= 512 else widths


def normalize_buckets(buckets: Sequence[int] | None, max_len: int) -> tuple[int, ...]:
    """The injection widths run_slots uses: sorted, unique, capped at max_len (None: defaults)."""
    if not buckets:
        return default_buckets(max_len)
    return tuple(sorted({min(int(b), max_len) for b in buckets}))


def default_lanes(slots: int) -> int:
    """Rows an injection extends together: an eighth of the slots (at least 1). A host call of a
    rollout usually writes into one or two slots (a tool response, a new prompt), and each lane
    costs a full-width extend whether or not a row fills it; a refill of many slots runs several
    extends of `lanes` rows (more passes over the weights, the same attention work)."""
    return max(1, slots // 8)


# ----------------------------------------------------------------------------- the jitted loop


class _LoopState(NamedTuple):
    cache: KVCache  # or paged_cache.PagedKVCache
    logits: jax.Array  # float32[B, V]: next-token logits of each slot
    active: jax.Array  # bool[B]
    stopped: jax.Array  # bool[B]: stopped since the last host call
    stop_reason: jax.Array  # int32[B]
    turn_tokens: jax.Array  # int32[B, max_turn]
    turn_logprobs: jax.Array  # float32[B, max_turn]
    turn_len: jax.Array  # int32[B]
    turn_cap: jax.Array  # int32[B]: tokens the current turn may sample (<= max_turn)
    stream: jax.Array  # int32[B]: each slot's sampling stream (SlotInjection.stream)
    profile: jax.Array  # int32[B]: each slot's sampling profile (SlotInjection.profile)
    decode_steps: jax.Array  # int32 scalar
    host_calls: jax.Array  # int32 scalar
    sampled_tokens: jax.Array  # int32 scalar
    done: jax.Array  # bool scalar


def _stop_reasons(tokens, stop_table):
    reason = jnp.full(tokens.shape, STOP_NONE, jnp.int32)
    for token_id, token_reason in stop_table:
        reason = jnp.where(tokens == token_id, token_reason, reason)
    return reason


def _decode_step(model, s: _LoopState, rng, profiles: ProfileValues, truncation: Truncation,
                 stop_tables, max_len: int, profile_roles):
    """Samples one token for every active slot with room left, records it, and decodes it.
    profiles / stop_tables: profile p's settings and ((token, reason), ...) (slots pick one by
    s.profile); profile_roles [P]: profile p's role id (a slot's LoRA adapter)."""
    slots, max_turn = s.turn_tokens.shape
    rows = jnp.arange(slots)
    full = s.cache.lengths >= max_len
    sampling_rows = s.active & ~full
    keys = functools.partial(draw_keys, rng, s.stream, s.cache.lengths)  # only when sampling
    tokens, logprobs = sample_with_profiles(s.logits, keys, profiles, s.profile, truncation)
    # Rows that do not sample write to column max_turn, which mode="drop" discards.
    column = jnp.where(sampling_rows, s.turn_len, max_turn)
    turn_tokens = s.turn_tokens.at[rows, column].set(tokens, mode="drop")
    turn_logprobs = s.turn_logprobs.at[rows, column].set(logprobs, mode="drop")
    turn_len = s.turn_len + sampling_rows
    # The sampled token always enters the cache (the stop token too): the context stays complete,
    # so the host only appends what comes after it.
    new_logits, cache = model.decode(tokens, s.cache, sampling_rows, profile_roles[s.profile])
    logits = jnp.where(sampling_rows[:, None], new_logits, s.logits)

    stops = _stop_reasons(tokens, stop_tables[0])
    for index, table in enumerate(stop_tables[1:], start=1):
        stops = jnp.where(s.profile == index, _stop_reasons(tokens, table), stops)
    reason = jnp.where(sampling_rows, stops, STOP_NONE)
    reason = jnp.where(sampling_rows & (reason == STOP_NONE) & (turn_len >= s.turn_cap),
                       STOP_TURN_CAP, reason)
    reason = jnp.where(sampling_rows & (reason == STOP_NONE) & (cache.lengths >= max_len),
                       STOP_CACHE_FULL, reason)
    # An active slot injected up to max_len has no room for even one token.
    reason = jnp.where(s.active & full, STOP_CACHE_FULL, reason)
    newly_stopped = reason != STOP_NONE
    return s._replace(
        cache=cache, logits=logits, active=s.active & ~newly_stopped,
        stopped=s.stopped | newly_stopped, stop_reason=jnp.where(newly_stopped, reason, s.stop_reason),
        turn_tokens=turn_tokens, turn_logprobs=turn_logprobs, turn_len=turn_len,
        decode_steps=s.decode_steps + 1, sampled_tokens=s.sampled_tokens + jnp.sum(sampling_rows))


def _host_round(model, s: _LoopState, session_id, buckets, lanes: int, max_len: int,
                profile_roles, store=None, constrain=lambda s: s, replicated=lambda x: x):
    """One host call with the current events, then the injection it answers with."""
    slots, max_turn = s.turn_tokens.shape
    result_shapes = (jax.ShapeDtypeStruct((slots,), jnp.int32),
                     jax.ShapeDtypeStruct((slots,), jnp.bool_),
                     jax.ShapeDtypeStruct((slots,), jnp.bool_),
                     jax.ShapeDtypeStruct((slots,), jnp.int32),
                     jax.ShapeDtypeStruct((slots,), jnp.int32),
                     jax.ShapeDtypeStruct((slots,), jnp.int32),
                     jax.ShapeDtypeStruct((slots,), jnp.int32),
                     jax.ShapeDtypeStruct((), jnp.bool_))
    counts = jnp.where(s.stopped, s.turn_len, 0)
    widths = flat_widths(slots * max_turn)

    def call_host_with(width):
        # The stopped turns packed at this static width; the switch below picks the smallest
        # width that holds them.
        def call(_):
            operands = replicated((s.stopped, s.stop_reason, s.turn_len, s.cache.lengths,
                                   pack_rows(s.turn_tokens, counts, width),
                                   pack_rows(s.turn_logprobs, counts, width)))
            return replicated(io_callback(call_host, result_shapes, session_id, *operands,
                                          ordered=True))
        return call

    chosen = jnp.sum(jnp.asarray(widths) < jnp.sum(counts))
    num, reset, active, prefix, turn_cap, stream, profile, done = jax.lax.switch(
        chosen, [call_host_with(width) for width in widths], None)
    logits = s.logits
    if isinstance(s.cache, paged_cache.PagedKVCache):  # reset slots give their pages back
        cache = paged_cache.release(s.cache, reset)
        if store is not None:
            cache, logits = share_prefixes(cache, logits, store, prefix)
    else:
        cache = s.cache._replace(lengths=jnp.where(reset, 0, s.cache.lengths))
        if store is not None:
            cache, logits = copy_prefixes(cache, logits, store, prefix)
    num = jnp.minimum(num, max_len - cache.lengths)  # the host checks this; never write past the end
    # The profile a slot decodes with from now on; its role picks the injection's adapter too.
    profile = jnp.where(profile >= 0, profile, s.profile)
    cache, logits = inject(model, cache, logits, host_reader(session_id, replicated), num,
                           buckets, lanes, max_num=max_len, roles=profile_roles[profile])
    # A new turn starts for slots that stopped or received tokens.
    new_turn = s.stopped | reset | (num > 0)
    turn_cap = jnp.where(new_turn, jnp.where(turn_cap > 0, turn_cap, max_turn), s.turn_cap)
    return constrain(s._replace(
        cache=cache, logits=logits, active=active, stopped=jnp.zeros_like(s.stopped),
        stop_reason=jnp.zeros_like(s.stop_reason), turn_len=jnp.where(new_turn, 0, s.turn_len),
        turn_cap=turn_cap, stream=jnp.where(stream >= 0, stream, s.stream),
        profile=profile,
        host_calls=s.host_calls + 1, done=done))


def _state_constraint(mesh: Mesh | None):
    """A function that pins the loop state's large arrays to their shardings over `mesh`: the KV
    cache as `cache_shardings`, logits and turn buffers split on slots (identity without a mesh).
    The while loops carry what their bodies return, so every body ends with it."""
    if mesh is None:
        return lambda s: s

    def on_slots(x):
        spec = fit_spec(P(BATCH_AXES), x.shape, mesh)
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    def constrain(s: _LoopState) -> _LoopState:
        cache = jax.lax.with_sharding_constraint(s.cache, cache_shardings(s.cache, mesh))
        return s._replace(cache=cache, logits=on_slots(s.logits),
                          turn_tokens=on_slots(s.turn_tokens),
                          turn_logprobs=on_slots(s.turn_logprobs))
    return constrain


def _replication(mesh: Mesh | None):
    """A function that replicates a pytree over `mesh` (identity without one): the callbacks'
    operands and answers, so that the partitioner moves them to and from the host device from
    a replicated layout instead of remateralising sharded ones (small [B] arrays)."""
    if mesh is None:
        return lambda tree: tree
    everywhere = NamedSharding(mesh, P())
    return lambda tree: jax.tree_util.tree_map(
        lambda x: jax.lax.with_sharding_constraint(x, everywhere), tree)


@functools.partial(jax.jit, static_argnames=(
    "graphdef", "slots", "max_len", "max_turn", "buckets", "lanes", "truncation", "stop_tables",
    "mesh", "paged"))
def _slot_loop(graphdef, model_state, rng, session_id, max_steps, max_host_calls, prefix_tokens,
               prefix_lengths, profiles, prefix_roles=None, profile_roles=None, *, slots, max_len,
               max_turn, buckets, lanes, truncation, stop_tables, mesh=None, paged=None):
    # The mesh runs the paged cache per batch shard and the paged decode kernel per shard
    # (model/paged_sharding.py, model/kernel_sharding.py).
    with kernel_mesh(mesh):
        return _slot_loop_body(graphdef, model_state, rng, session_id, max_steps, max_host_calls,
                               prefix_tokens, prefix_lengths, profiles, prefix_roles,
                               profile_roles, slots=slots, max_len=max_len, max_turn=max_turn,
                               buckets=buckets, lanes=lanes, truncation=truncation,
                               stop_tables=stop_tables, mesh=mesh, paged=paged)


def _slot_loop_body(graphdef, model_state, rng, session_id, max_steps, max_host_calls,
                    prefix_tokens, prefix_lengths, profiles, prefix_roles, profile_roles, *,
                    slots, max_len, max_turn, buckets, lanes, truncation, stop_tables, mesh,
                    paged):
    model = nnx.merge(graphdef, model_state)
    # Role ids (LoRA adapters) of the prefixes and the sampling profiles; None: role 0.
    if prefix_roles is None:
        prefix_roles = jnp.zeros(prefix_tokens.shape[:1], jnp.int32)
    if profile_roles is None:
        profile_roles = jnp.zeros((len(stop_tables),), jnp.int32)
    config = model.config
    constrain, replicated = _state_constraint(mesh), _replication(mesh)
    store = None
    if paged is None:
        cache = init_cache(config, slots, max_len)
        if prefix_tokens.shape[0]:
            store = build_prefix_store(model, prefix_tokens, prefix_lengths, buckets,
                                       prefix_roles)
            if mesh is not None:
                store = PrefixStore(jax.lax.with_sharding_constraint(
                    store.cache, cache_shardings(store.cache, mesh)), store.logits)
    else:
        shards = paged_sharding.batch_shards(mesh)
        cache = paged_cache.init_paged_cache(
            config.num_hidden_layers, config.num_key_value_heads, config.head_dim, slots,
            max_len, paged.pool(slots, prefix_tokens.shape[0], max_len, shards), paged.page_size,
            config.dtype, shards=shards)
        if prefix_tokens.shape[0]:
            cache, store = build_paged_prefix_store(model, cache, prefix_tokens, prefix_lengths,
                                                    buckets, prefix_roles)
    state = constrain(_LoopState(
        cache=cache,
        logits=jnp.zeros((slots, config.vocab_size), jnp.float32),
        active=jnp.zeros((slots,), bool), stopped=jnp.zeros((slots,), bool),
        stop_reason=jnp.zeros((slots,), jnp.int32),
        turn_tokens=jnp.zeros((slots, max_turn), jnp.int32),
        turn_logprobs=jnp.zeros((slots, max_turn), jnp.float32),
        turn_len=jnp.zeros((slots,), jnp.int32),
        turn_cap=jnp.full((slots,), max_turn, jnp.int32),
        stream=jnp.arange(slots, dtype=jnp.int32),
        profile=jnp.zeros((slots,), jnp.int32),
        decode_steps=jnp.int32(0), host_calls=jnp.int32(0), sampled_tokens=jnp.int32(0),
        done=jnp.bool_(False)))

    def under_limits(s):
        # A paged cache out of pages stops the loop (run_slots then raises).
        within = (s.decode_steps < max_steps) & (s.host_calls < max_host_calls)
        return within & ~jnp.any(s.cache.overflow) if paged is not None else within

    def decode_until_a_stop(s):
        return jax.lax.while_loop(
            lambda s: ~s.done & ~jnp.any(s.stopped) & jnp.any(s.active) & under_limits(s),
            lambda s: constrain(_decode_step(model, s, rng, profiles, truncation, stop_tables,
                                             max_len, profile_roles)), s)

    def outer_body(s):
        return decode_until_a_stop(_host_round(model, s, session_id, buckets, lanes, max_len,
                                               profile_roles, store, constrain, replicated))

    final = jax.lax.while_loop(lambda s: ~s.done & under_limits(s), outer_body, state)
    overflow = jnp.any(final.cache.overflow) if paged is not None else jnp.bool_(False)
    return final.decode_steps, final.host_calls, final.sampled_tokens, final.done, overflow


def mesh_of(model_state) -> Mesh | None:
    """The mesh the parameters are sharded over (NamedSharding on more than one device), or
    None: run_slots then shards its cache over the same mesh."""
    for leaf in jax.tree_util.tree_leaves(model_state):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
            return sharding.mesh
    return None


def run_slots(model_state, graphdef, host: SlotHost, *, slots: int, max_len: int,
              max_turn: int | None = None, sampling: Sampling = Sampling(),
              stop_ids: Mapping[int, int] | Sequence[int] = (), rng=None,
              buckets: Sequence[int] | None = None, lanes: int | None = None,
              prefixes: Sequence[Sequence[int]] = (), prefix_rows: int = 0,
              max_steps: int = 1 << 30,
              max_host_calls: int = 1 << 30, mesh: Mesh | None = None,
              more_profiles: Sequence[tuple[Sampling, Mapping[int, int] | Sequence[int]]] = (),
              profile_roles: Sequence[int] | None = None,
              prefix_roles: Sequence[int] | None = None,
              paged: PagedCache | None = None) -> SlotLoopStats:
    """Runs the slot loop until the host answers done (or a safety cap is hit).

    model_state, graphdef: `nnx.split(model)`. max_turn: the per-turn token cap and the width of
    SlotEvents.turn_tokens (default sampling.max_turn_tokens). stop_ids: {token_id: STOP_*} (see
    `chat_stop_ids`) or a plain id list (reported as STOP_EOS). buckets: static injection widths
    (default `default_buckets(max_len)`); longer injections are written in chunks of the last.
    lanes: rows extended together by an injection (default `default_lanes(slots)`); a host call
    writing into n rows runs ceil(n / lanes) extends of `lanes` rows each.
    prefixes: token lists many sequences start with; their keys and values are computed once,
    when the loop starts, and a host starts a reset slot from one (SlotInjection.prefix) instead
    of writing those tokens again. prefix_rows: rows the prefix store has at least (padding
    rows cost no compute): the count a larger batch of the same run registers, so that a call
    with fewer prefixes (an evaluation beside the rollouts) runs the loop that batch compiled.
    max_steps / max_host_calls: safety caps (hit_limit=True in the result when one ended the loop).
    mesh: shards the KV cache, logits and turn buffers over it (slots over data x fsdp, kv heads
    over tensor); default: the mesh model_state is sharded over (`mesh_of`), none if unsharded.
    more_profiles: ((Sampling, stop_ids), ...): sampling profiles 1, 2, ... next to profile 0
    (`sampling`, `stop_ids`); a slot decodes with the one its SlotInjection.profile names, so
    planner and worker slots of one batch sample at their own temperature and top-p and stop at
    their own ids (top_k must be the same). Their turn caps are SlotInjection.turn_cap's.
    profile_roles: the role id of each profile (default 0 for all): a LoRA model decodes and
    extends every slot with its profile's role's adapter (agents/rollout.py gives planners profile
    0 and workers 1, their role ids). prefix_roles: the role id of each of `prefixes` (default 0),
    whose keys and values are computed with that role's adapter. Both are operands: no recompile.
    paged: keep the KV cache in pages (`PagedCache`; None: the dense slots x max_len cache):
    memory by the tokens in flight, prefixes shared by page instead of copied. A pool that runs
    short stops the loop and raises SlotProtocolError. On a mesh that splits the slots, each
    batch shard has its own pool of num_pages / shards pages (model/paged_sharding.py).
    All results reach the host through SlotEvents; this returns counters and the bytes each host
    round moved."""
    max_turn = sampling.max_turn_tokens if max_turn is None else int(max_turn)
    buckets = normalize_buckets(buckets, max_len)
    if buckets[0] <= 0:
        raise SlotProtocolError(f"buckets must be positive widths, got {buckets}")
    lanes = default_lanes(slots) if lanes is None else min(int(lanes), slots)
    if lanes <= 0:
        raise SlotProtocolError(f"lanes must be a positive row count, got {lanes}")
    mesh = mesh_of(model_state) if mesh is None else mesh
    if paged is not None:
        if max_len % paged.page_size:
            raise SlotProtocolError(f"a paged KV cache needs max_len ({max_len}) to be a multiple "
                                    f"of its page size ({paged.page_size})")
        refusal = paged_mesh_refusal(slots, paged.num_pages, paged_sharding.batch_shards(mesh))
        if refusal:
            raise SlotProtocolError(refusal)
    rng = jax.random.key(0) if rng is None else rng
    prefix_tokens, prefix_lengths = _prefix_arrays(prefixes, buckets, max_len, prefix_rows)
    prefix_role_ids = np.zeros(prefix_tokens.shape[0], np.int32)
    if prefix_roles is not None:
        if len(prefix_roles) != len(prefixes):
            raise SlotProtocolError(f"prefix_roles has {len(prefix_roles)} entries for "
                                    f"{len(prefixes)} prefixes")
        prefix_role_ids[:len(prefix_roles)] = prefix_roles
    profile_count = 1 + len(more_profiles)
    profile_role_ids = np.zeros(profile_count, np.int32)
    if profile_roles is not None:
        if len(profile_roles) != profile_count:
            raise SlotProtocolError(f"profile_roles has {len(profile_roles)} entries for "
                                    f"{profile_count} sampling profiles")
        profile_role_ids[:] = profile_roles
    # Profile settings are operands, not constants: a greedy evaluation and sampled rollouts with
    # the same shapes, stop ids and truncation run one compiled loop.
    values, truncation = profile_settings((sampling,) + tuple(p for p, _ in more_profiles))
    stop_tables = (stop_table(stop_ids),) + tuple(stop_table(ids) for _, ids in more_profiles)
    session = HostSession(host, slots, max_len, max_turn, [len(p) for p in prefixes],
                          profiles=len(stop_tables))
    with registered(session) as session_id:
        counters = _slot_loop(graphdef, model_state, rng, jnp.int32(session_id),
                              jnp.int32(min(max_steps, 2**31 - 1)),
                              jnp.int32(min(max_host_calls, 2**31 - 1)), prefix_tokens,
                              prefix_lengths, values, jnp.asarray(prefix_role_ids),
                              jnp.asarray(profile_role_ids), slots=slots,
                              max_len=max_len, max_turn=max_turn, buckets=buckets,
                              lanes=lanes, truncation=truncation, stop_tables=stop_tables,
                              mesh=mesh, paged=paged)
        decode_steps, host_calls, sampled, done, overflow = jax.device_get(counters)
    if session.error is not None:
        raise session.error
    if overflow:
        shards = paged_sharding.batch_shards(mesh)
        pool = paged.pool(slots, prefix_tokens.shape[0], max_len, shards)
        where = f" ({pool // shards} in each of {shards} batch shards' pools)" if shards > 1 else ""
        raise SlotProtocolError(f"the paged KV cache ran out of pages: {pool} pages of "
                                f"{paged.page_size} tokens{where} could not hold the tokens in "
                                f"flight (rollout.kv_pages; 0 sizes the pool for every slot at "
                                f"max_len)")
    return SlotLoopStats(int(decode_steps), int(host_calls), int(sampled), not bool(done),
                         tuple(tuple(r) for r in session.traffic.rounds))


def _prefix_arrays(prefixes: Sequence[Sequence[int]], buckets: Sequence[int], max_len: int,
                   min_rows: int = 0):
    """The store's input: tokens [rows, width] and lengths [rows] (padding rows have length 0;
    at least min_rows of them when there are prefixes)."""
    lengths = [len(p) for p in prefixes]
    for index, length in enumerate(lengths):
        if not 0 < length <= max_len:
            raise SlotProtocolError(f"prefixes[{index}] has {length} tokens; a prefix needs 1 to "
                                    f"max_len={max_len}")
    rows, width = prefix_store_shape(lengths, buckets, max_len)
    if rows:
        rows = max(rows, prefix_store_shape([1] * int(min_rows), buckets, max_len)[0])
    tokens = np.zeros((rows, max(width, 1)), np.int32)
    for index, prefix in enumerate(prefixes):
        tokens[index, :len(prefix)] = prefix
    padded = np.zeros(rows, np.int32)
    padded[:len(lengths)] = lengths
    return jnp.asarray(tokens), jnp.asarray(padded)


# ----------------------------------------------------------------------------- plain generation


class _PromptQueueHost:
    """Loads prompts into free slots and collects each one's single turn when its slot stops."""

    def __init__(self, prompts: Sequence[Sequence[int]], slots: int):
        self.pending = collections.deque(enumerate(prompts))
        self.slot_prompt: list[int | None] = [None] * slots
        self.width = max(len(p) for p in prompts)
        self.tokens: list[np.ndarray | None] = [None] * len(prompts)
        self.logprobs: list[np.ndarray | None] = [None] * len(prompts)

    def __call__(self, events: SlotEvents) -> SlotInjection:
        slots = len(self.slot_prompt)
        injection = SlotInjection.nothing(slots, self.width)
        for slot in range(slots):
            index = self.slot_prompt[slot]
            if index is not None and events.stopped[slot]:
                self.tokens[index], self.logprobs[index] = events.turn(slot)
                self.slot_prompt[slot] = index = None
            if index is None and self.pending:
                index, prompt = self.pending.popleft()
                self.slot_prompt[slot] = index
                injection.tokens[slot, :len(prompt)] = prompt
                injection.num[slot] = len(prompt)
                injection.reset[slot] = True
                injection.stream[slot] = index  # a prompt samples alike in any slot
            injection.active[slot] = index is not None
        injection.done = not injection.active.any()
        return injection


def generate(model_state, graphdef, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             sampling: Sampling = Sampling(), stop_ids: Mapping[int, int] | Sequence[int] = (),
             rng=None, *, slots: int | None = None, max_len: int | None = None,
             length_multiple: int = 128, mesh: Mesh | None = None,
             paged: PagedCache | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Batched generation over the slot loop: (tokens, logprobs) sampled after each prompt.

    Each prompt gets one turn of at most max_new_tokens, ending at a stop id. slots defaults to
    all prompts at once (fewer slots queue the rest); max_len defaults to the longest prompt +
    max_new_tokens rounded up to length_multiple, so similar batches share one compilation.
    mesh, paged: as run_slots'.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise SlotProtocolError("prompts must be a non-empty list of non-empty token lists")
    slots = slots or len(prompts)
    needed = max(len(p) for p in prompts) + max_new_tokens
    if max_len is None:
        max_len = -(-needed // length_multiple) * length_multiple
    elif max_len < needed:
        raise SlotProtocolError(f"max_len={max_len} < longest prompt + max_new_tokens = {needed}")
    host = _PromptQueueHost(prompts, slots)
    # lanes=slots: the first host call fills every slot at once, as one extend of all rows.
    run_slots(model_state, graphdef, host, slots=slots, max_len=max_len, max_turn=max_new_tokens,
              sampling=sampling, stop_ids=stop_ids, rng=rng, lanes=slots, mesh=mesh,
              paged=paged)
    return host.tokens, host.logprobs
