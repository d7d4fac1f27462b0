"""How many decode slots fit in a chip's memory, and a clear error at start when too few do.

The slot loop's KV cache holds, per slot, every layer's keys and values for max_len positions:
layers x kv_heads x head_dim x max_len x 2 (K, V) x dtype bytes. Over a mesh it is split like
`parallel.cache_shardings`: kv heads over "tensor" (when they divide evenly; otherwise every
tensor shard holds all heads) and slots over "data" x "fsdp" (when the slot count divides; this
module insists that it does, since a replicated cache multiplies the memory by the shard count).
Each slot also keeps float32 next-token logits [vocab] and its turn buffers (int32 tokens and
float32 log-probs [max_turn]), split over slots but not over tensor. Not counted: the shared
prefix store (one row per registered prefix, usually a few percent of the slots' positions) and
the transient activations of an extend.

A paged KV cache (rollout.kv_cache=paged) holds a pool of pages instead, split over "tensor" on kv
heads and not over the slots: its memory is pages x one page of every layer's keys and values,
whatever the slot count, and each slot adds its buffers and a row of the page table
(`check_paged_pool`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from matpo_jax.model.config import DecoderConfig


class DecodeSlotsError(ValueError):
    """Fewer decode slots fit than the config asks for (or they cannot be split evenly)."""


@dataclass(frozen=True)
class SlotBudget:
    """What one decode slot costs on one chip and how many slots fit the mesh."""

    kv_bytes_per_slot: int  # this chip's share of one slot's KV cache
    other_bytes_per_slot: int  # logits and turn buffers of one slot
    kv_heads_per_chip: int
    batch_shards: int  # data x fsdp: the slots are split over these
    slots_per_chip: int  # slots whose state fits the per-chip budget
    slots_that_fit: int  # slots_per_chip x batch_shards

    @property
    def bytes_per_slot(self) -> int:
        return self.kv_bytes_per_slot + self.other_bytes_per_slot


def kv_heads_per_chip(config: DecoderConfig, tensor: int) -> int:
    """KV heads one chip holds: split over tensor when it divides them (`fit_spec`)."""
    heads = config.num_key_value_heads
    return heads // tensor if heads % tensor == 0 else heads


def kv_bytes_per_slot(config: DecoderConfig, max_len: int, tensor: int = 1,
                      dtype: str | None = None) -> int:
    """One slot's KV cache on one chip: layers x kv_heads / tensor x head_dim x max_len x 2 x
    dtype bytes (dtype defaults to the model's compute dtype, the cache's)."""
    itemsize = np.dtype(dtype or config.dtype).itemsize
    return (config.num_hidden_layers * kv_heads_per_chip(config, tensor) * config.head_dim
            * max_len * 2 * itemsize)


def decode_slot_budget(config: DecoderConfig, max_len: int, per_chip_bytes: int, *,
                       data: int = 1, fsdp: int = 1, tensor: int = 1, max_turn: int = 0,
                       dtype: str | None = None) -> SlotBudget:
    """How many decode slots of max_len positions fit when each chip has per_chip_bytes for them
    (its HBM minus parameters, optimizer state and the rest), on a data x fsdp x tensor mesh."""
    for name, value in (("max_len", max_len), ("data", data), ("fsdp", fsdp),
                        ("tensor", tensor)):
        if int(value) <= 0:
            raise DecodeSlotsError(f"{name} must be a positive integer, got {value!r}")
    kv = kv_bytes_per_slot(config, max_len, tensor, dtype)
    other = 4 * config.vocab_size + 8 * max(0, int(max_turn))
    per_chip = max(0, int(per_chip_bytes)) // (kv + other)
    shards = int(data) * int(fsdp)
    return SlotBudget(kv_bytes_per_slot=kv, other_bytes_per_slot=other,
                      kv_heads_per_chip=kv_heads_per_chip(config, tensor), batch_shards=shards,
                      slots_per_chip=per_chip, slots_that_fit=per_chip * shards)


def check_decode_slots(requested: int, config: DecoderConfig, max_len: int, per_chip_bytes: int,
                       *, data: int = 1, fsdp: int = 1, tensor: int = 1, max_turn: int = 0,
                       dtype: str | None = None, field: str = "rollout.decode_slots"
                       ) -> SlotBudget:
    """The budget when `requested` slots fit; otherwise DecodeSlotsError, one line naming
    `field`, what a slot costs per chip and how many fit."""
    budget = decode_slot_budget(config, max_len, per_chip_bytes, data=data, fsdp=fsdp,
                                tensor=tensor, max_turn=max_turn, dtype=dtype)
    if requested % budget.batch_shards:
        raise DecodeSlotsError(
            f"{field}={requested} is not a multiple of mesh data x fsdp = {budget.batch_shards}: "
            "the slots could not be split over the chips and every chip would hold the whole "
            "cache")
    if requested > budget.slots_that_fit:
        itemsize = np.dtype(dtype or config.dtype).itemsize
        raise DecodeSlotsError(
            f"{field}={requested} does not fit: only {budget.slots_that_fit} decode slots fit "
            f"({budget.slots_per_chip} per chip x {budget.batch_shards} data x fsdp shards); one "
            f"slot needs {_mib(budget.bytes_per_slot)} per chip (KV cache "
            f"{config.num_hidden_layers} layers x {budget.kv_heads_per_chip} kv heads x "
            f"{config.head_dim} x max_len {max_len} x 2 x {itemsize} bytes = "
            f"{_mib(budget.kv_bytes_per_slot)}) and the budget is {_mib(per_chip_bytes)} per "
            f"chip; lower {field} or the context length, or raise mesh.tensor")
    return budget


def _mib(value: int) -> str:
    return f"{value / 2**20:,.1f} MiB"


def paged_mesh_refusal(slots: int, pages: int, batch_shards: int) -> str | None:
    """Why a paged cache of `pages` pages (0: sized by the loop) cannot split `slots` decode
    slots over `batch_shards` (data x fsdp) pools, or None where it can (the sampler, the plan
    and the fit check all ask): each shard needs a whole share of both."""
    if batch_shards <= 1:
        return None
    if slots % batch_shards:
        return (f"rollout.kv_cache=paged keeps a pool per batch shard and {slots} decode slots "
                f"do not split over data x fsdp = {batch_shards}: make rollout.decode_slots a "
                f"multiple of {batch_shards}")
    if pages % batch_shards:
        return (f"rollout.kv_pages={pages} does not split over data x fsdp = {batch_shards} "
                f"pools (a pool per batch shard): make it a multiple of {batch_shards}")
    return None


def page_bytes(config: DecoderConfig, page_size: int, tensor: int = 1,
               dtype: str | None = None) -> int:
    """One page of a paged cache on one chip: page_size positions of every layer's K and V."""
    return kv_bytes_per_slot(config, page_size, tensor, dtype)


def paged_slot_budget(config: DecoderConfig, max_len: int, per_chip_bytes: int, *, slots: int,
                      pages: int, page_size: int, tensor: int = 1, max_turn: int = 0,
                      dtype: str | None = None, batch_shards: int = 1) -> SlotBudget:
    """The budget of a paged cache of `pages` pages shared by `slots` slots (split over tensor;
    with batch_shards > 1, a pool of pages / batch_shards for each shard's slots / batch_shards
    slots): a slot's KV share is the pool's mean a slot, and the slots that fit are those whose
    buffers and mean pool share fit per_chip_bytes (the same mean fill)."""
    for name, value in (("slots", slots), ("pages", pages), ("page_size", page_size),
                        ("tensor", tensor), ("batch_shards", batch_shards)):
        if int(value) <= 0:
            raise DecodeSlotsError(f"{name} must be a positive integer, got {value!r}")
    mean_kv = -(-pages * page_bytes(config, page_size, tensor, dtype) // slots)
    # Logits, turn buffers, and the slot's page table row and length.
    other = 4 * config.vocab_size + 8 * max(0, int(max_turn)) + 4 * (max_len // page_size + 1)
    per_chip = max(0, int(per_chip_bytes)) // (mean_kv + other)
    return SlotBudget(kv_bytes_per_slot=mean_kv, other_bytes_per_slot=other,
                      kv_heads_per_chip=kv_heads_per_chip(config, tensor),
                      batch_shards=batch_shards, slots_per_chip=per_chip,
                      slots_that_fit=per_chip * batch_shards)


def check_paged_pool(requested: int, config: DecoderConfig, max_len: int, per_chip_bytes: int,
                     *, pages: int, page_size: int, tensor: int = 1, max_turn: int = 0,
                     dtype: str | None = None, field: str = "rollout.kv_pages",
                     batch_shards: int = 1) -> SlotBudget:
    """The budget when a chip's pool (pages / batch_shards pages) and its slots' buffers
    (requested / batch_shards) fit per_chip_bytes; otherwise DecodeSlotsError, one line naming
    `field`, what a page costs and the pool's total."""
    budget = paged_slot_budget(config, max_len, per_chip_bytes, slots=requested, pages=pages,
                               page_size=page_size, tensor=tensor, max_turn=max_turn, dtype=dtype,
                               batch_shards=batch_shards)
    page = page_bytes(config, page_size, tensor, dtype)
    chip_pages, chip_slots = -(-pages // batch_shards), -(-requested // batch_shards)
    need = chip_pages * page + chip_slots * budget.other_bytes_per_slot
    if need > per_chip_bytes:
        itemsize = np.dtype(dtype or config.dtype).itemsize
        fitting = max(0, int(per_chip_bytes) - chip_slots * budget.other_bytes_per_slot) // page
        split = (f" (one of {batch_shards} batch shards' pools, {pages} pages in all)"
                 if batch_shards > 1 else "")
        raise DecodeSlotsError(
            f"{field}={pages} does not fit: a pool of {chip_pages} pages{split} needs "
            f"{_mib(chip_pages * page)} per chip (a page is {config.num_hidden_layers} layers x "
            f"{budget.kv_heads_per_chip} kv heads x {config.head_dim} x {page_size} tokens x 2 "
            f"x {itemsize} bytes = {_mib(page)}) beside {chip_slots} slots' buffers "
            f"({_mib(chip_slots * budget.other_bytes_per_slot)}), and the budget is "
            f"{_mib(per_chip_bytes)} per chip; {fitting} pages fit a chip "
            f"({fitting * page_size:,} tokens in flight, a mean "
            f"{fitting * page_size // chip_slots:,} a slot): lower {field} or "
            "rollout.decode_slots, or raise mesh.tensor")
    return budget
