"""Does a config fit the chips at all? The analytic part of the plan, cheap enough to run before
any work: per chip, the parameters, optimizer state and gradients a train step holds, and the
parameters, optimizer state and KV cache the sampler holds during rollouts, against the HBM.

Arrays are built as shapes only (nothing is allocated) with the shardings training gives them,
so the per-chip figures are those of the real layout; the KV cache and per-slot buffers are
counted by `sampler.capacity` (what the sampler allocates). Not counted: the train step's
activations and the decode step's temporaries (they depend on the compiler: `python -m
matpo_jax.plan` compiles both for the topology).
"""
from __future__ import annotations

import dataclasses

from matpo_jax.config.errors import ConfigError
from matpo_jax.planning import accounting
from matpo_jax.planning.step_plan import PlanInputs, abstract_model, abstract_train_state
from matpo_jax.planning.topology import chip_for_device_kind
from matpo_jax.sampler.capacity import (DecodeSlotsError, check_decode_slots, check_paged_pool,
                                        decode_slot_budget, page_bytes, paged_mesh_refusal,
                                        paged_slot_budget)
from matpo_jax.trainer import step as step_lib

GiB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class FitEstimate:
    """Per-chip bytes of what is always resident, and the decode slots that fit beside it."""

    hbm: int
    parameters: int
    optimizer_state: int
    gradients: int  # the train step's accumulator: a param-dtype copy of the parameters
    kv_cache: int  # this chip's share of decode_slots x max_context, or of the paged pool
    slot_buffers: int  # the slots' next-token logits and turn buffers
    slots_that_fit: int

    @property
    def train_step_minimum(self) -> int:
        return self.parameters + self.optimizer_state + self.gradients

    @property
    def rollout_total(self) -> int:
        return self.parameters + self.optimizer_state + self.kv_cache + self.slot_buffers


def device_hbm_bytes(device) -> int | None:
    """A TPU device's memory (what its allocator may use, else the chip's published HBM); None
    for other platforms, whose memory this check does not plan."""
    if device.platform != "tpu":
        return None
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    chip = chip_for_device_kind(device.device_kind)
    return chip.hbm_bytes if chip else None


def estimate(inputs: PlanInputs, mesh, hbm: int) -> FitEstimate:
    """The per-chip figures of `inputs` laid out on `mesh` (real or TPU-topology devices)."""
    _, params, frozen = abstract_model(inputs.model, inputs.lora)
    state, _ = abstract_train_state(params, frozen, step_lib.make_optimizer(inputs.optimizer),
                                    mesh)
    trained = accounting.per_chip_bytes(state.params)  # LoRA: the adapters; the base is frozen
    parameters = trained + accounting.per_chip_bytes(state.frozen)
    optimizer_state = accounting.per_chip_bytes(state.opt_state)
    axes = dict(data=mesh.shape["data"], fsdp=mesh.shape["fsdp"], tensor=mesh.shape["tensor"])
    if inputs.kv_cache == "paged":
        # A pool per batch shard: each chip holds its shard's pages and slots.
        shards = axes["data"] * axes["fsdp"]
        pages = inputs.kv_pool_pages(inputs.decode_slots, shards)
        budget = paged_slot_budget(inputs.model, inputs.max_context,
                                   hbm - parameters - optimizer_state, slots=inputs.decode_slots,
                                   pages=pages, page_size=inputs.kv_page_size,
                                   tensor=axes["tensor"], max_turn=inputs.max_turn,
                                   batch_shards=shards)
        return FitEstimate(
            hbm=hbm, parameters=parameters, optimizer_state=optimizer_state, gradients=trained,
            kv_cache=-(-pages // shards) * page_bytes(inputs.model, inputs.kv_page_size,
                                                      axes["tensor"]),
            slot_buffers=-(-inputs.decode_slots // shards) * budget.other_bytes_per_slot,
            slots_that_fit=budget.slots_that_fit)
    budget = decode_slot_budget(inputs.model, inputs.max_context,
                                hbm - parameters - optimizer_state, max_turn=inputs.max_turn,
                                **axes)
    slots_per_chip = -(-inputs.decode_slots // budget.batch_shards)
    return FitEstimate(hbm=hbm, parameters=parameters, optimizer_state=optimizer_state,
                       gradients=trained,
                       kv_cache=slots_per_chip * budget.kv_bytes_per_slot,
                       slot_buffers=slots_per_chip * budget.other_bytes_per_slot,
                       slots_that_fit=budget.slots_that_fit)


def _gib(x: int) -> str:
    return f"{x / GiB:.2f} GiB" if abs(x) >= GiB / 10 else f"{x / 2**20:.2f} MiB"


def check_fits(inputs: PlanInputs, mesh, hbm: int) -> FitEstimate:
    """The estimate when both phases fit `hbm` bytes per chip; otherwise ConfigError, one line
    per phase that cannot fit, naming the fields to change."""
    fit = estimate(inputs, mesh, hbm)
    mesh_text = (f"mesh data={mesh.shape['data']}, fsdp={mesh.shape['fsdp']}, "
                 f"tensor={mesh.shape['tensor']}")
    problems = []
    if fit.train_step_minimum > hbm:
        problems.append(
            f"the train step cannot fit {_gib(hbm)} of HBM per chip: parameters "
            f"{_gib(fit.parameters)} + optimizer state {_gib(fit.optimizer_state)} + gradients "
            f"{_gib(fit.gradients)} = {_gib(fit.train_step_minimum)} per chip on {mesh_text} "
            "before any activation; spread the model over more chips (a larger slice, mesh.fsdp "
            "/ mesh.tensor) or keep fewer float32 copies (model.param_dtype)")
    room = hbm - fit.parameters - fit.optimizer_state
    if inputs.kv_cache == "paged":
        problems += _paged_problems(inputs, mesh, room)
    else:
        problems += _dense_problems(inputs, mesh, fit, hbm, room, mesh_text)
    if problems:
        raise ConfigError(problems)
    return fit


def _paged_problems(inputs: PlanInputs, mesh, room: int) -> list[str]:
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    pages = inputs.kv_pool_pages(inputs.decode_slots, shards)
    refusal = paged_mesh_refusal(inputs.decode_slots, pages, shards)
    if refusal:
        return [refusal]
    try:
        check_paged_pool(inputs.decode_slots, inputs.model, inputs.max_context, room,
                         pages=pages, page_size=inputs.kv_page_size, tensor=mesh.shape["tensor"],
                         max_turn=inputs.max_turn, batch_shards=shards)
    except DecodeSlotsError as error:
        return [str(error)]
    return []


def _dense_problems(inputs: PlanInputs, mesh, fit: FitEstimate, hbm: int, room: int,
                    mesh_text: str) -> list[str]:
    problems = []
    try:
        check_decode_slots(inputs.decode_slots, inputs.model, inputs.max_context, room,
                           data=mesh.shape["data"], fsdp=mesh.shape["fsdp"],
                           tensor=mesh.shape["tensor"], max_turn=inputs.max_turn)
    except DecodeSlotsError as error:
        uneven = inputs.decode_slots % (mesh.shape["data"] * mesh.shape["fsdp"])
        problems.append(str(error) if uneven else
            f"rollout.decode_slots={inputs.decode_slots} cannot fit {_gib(hbm)} of HBM per "
            f"chip: parameters {_gib(fit.parameters)} + optimizer state "
            f"{_gib(fit.optimizer_state)} + KV cache {_gib(fit.kv_cache)} (x "
            f"rollout.max_context={inputs.max_context}) + slot buffers {_gib(fit.slot_buffers)} "
            f"= {_gib(fit.rollout_total)} per chip on {mesh_text}; {fit.slots_that_fit} slots fit "
            f"(a multiple of data x fsdp = {mesh.shape['data'] * mesh.shape['fsdp']}): lower "
            "rollout.decode_slots or rollout.max_context, or raise mesh.tensor / use a larger "
            "slice")
    return problems


def summary(fit: FitEstimate) -> str:
    return (f"per chip: parameters {_gib(fit.parameters)}, optimizer state "
            f"{_gib(fit.optimizer_state)}, gradients {_gib(fit.gradients)}, KV cache "
            f"{_gib(fit.kv_cache)} of {_gib(fit.hbm)} HBM; decode slots that fit: "
            f"{fit.slots_that_fit}")
