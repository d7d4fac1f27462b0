"""Compile the real train step and one sampler decode step for a TPU topology, from abstract shapes.

Nothing is allocated: parameters, optimizer state, batch and KV cache are `jax.ShapeDtypeStruct`s
carrying the shardings training would give them, so a 14B model plans on a laptop. The compiled
executables' memory analysis gives per-chip arguments, outputs and peak; the per-chip split into
parameters, optimizer state, batch and KV cache comes from the shardings, and the rest of the
peak is the step's temporaries (activations, gradients, collectives' buffers).
"""
from __future__ import annotations

import dataclasses
import math
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from matpo_jax import parallel
from matpo_jax.model import DecoderConfig, CausalLM, attention_dispatch
from matpo_jax.model import lora as lora_lib
from matpo_jax.model import paged_cache
from matpo_jax.model.decoder import init_cache
from matpo_jax.model.kernel_sharding import kernel_mesh
from matpo_jax.planning import accounting
from matpo_jax.planning.topology import Topology
from matpo_jax.sampler.capacity import paged_mesh_refusal
from matpo_jax.trainer import step as step_lib
from matpo_jax.trainer.packing import PackedBatch


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    model: DecoderConfig
    mesh_shape: dict  # {"data", "fsdp", "tensor"}; one axis may be -1
    rows: int  # packed rows per train step (all micro-batches)
    row_length: int  # tokens per packed row
    step: step_lib.TrainStepConfig
    optimizer: step_lib.OptimizerConfig
    decode_slots: int  # sampler slots (the KV cache's batch)
    max_context: int  # KV cache length per slot
    max_turn: int = 0  # tokens one turn may generate (the sampler's per-slot turn buffers)
    mfu: float = 0.4  # model FLOPs utilisation assumed for the step-time estimate
    lora: lora_lib.LoRAConfig | None = None  # adapters over a frozen base (model.lora.*)
    kv_cache: str = "dense"  # rollout.kv_cache: dense (slots x max_context) or paged
    kv_page_size: int = 64  # rollout.kv_page_size
    kv_pages: int = 0  # rollout.kv_pages (0: every slot at max_context)
    # rl.share_prompts: the packed batches carry prefix_ids (every step's, whether or not a row
    # shares a prompt), and the train step attends through the shared-prompt rule.
    share_prompts: bool = False

    def kv_pool_pages(self, slots: int, batch_shards: int = 1) -> int:
        """A paged cache's pool for `slots` slots: kv_pages scaled from decode_slots to `slots`
        (the same mean fill a slot), or every slot at max_context when kv_pages is 0; a scaled
        pool is rounded up to a whole pool per batch shard (the configured one must divide)."""
        if not self.kv_pages:
            return slots * (self.max_context // self.kv_page_size)
        if slots == self.decode_slots:
            return self.kv_pages
        scaled = max(1, self.kv_pages * slots // self.decode_slots)
        return -(-scaled // batch_shards) * batch_shards


def _with_shardings(shapes, shardings):
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                        shapes, shardings)


def abstract_model(config: DecoderConfig, lora: lora_lib.LoRAConfig | None = None):
    """(graphdef, params, frozen) of the model as shapes only; with `lora`, params are the
    adapters and frozen the base (the train state's split)."""
    def build():
        model = CausalLM(config, rngs=nnx.Rngs(0))
        return model if lora is None else lora_lib.add_adapters(model, lora)
    return lora_lib.split_trainable(nnx.eval_shape(build))


def abstract_train_state(params, frozen, tx: optax.GradientTransformation, mesh):
    """The TrainState as sharded ShapeDtypeStructs, and its shardings (as init_train_state)."""
    shapes = jax.eval_shape(lambda p, f: step_lib.fresh_train_state(p, f, tx), params, frozen)
    shardings = step_lib.state_shardings(shapes, tx, mesh)
    return _with_shardings(shapes, shardings), shardings


def abstract_batch(rows: int, length: int, mesh, with_ref_logprobs: bool,
                   with_recomputed_logprobs: bool = False,
                   with_prefix_ids: bool = False) -> PackedBatch:
    sharding = parallel.batch_sharding(mesh)
    ints = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=sharding)
    floats = jax.ShapeDtypeStruct((rows, length), jnp.float32, sharding=sharding)
    return PackedBatch(tokens=ints, positions=ints, segment_ids=ints, role_ids=ints,
                       loss_mask=floats, advantages=floats, old_logprobs=floats,
                       loss_weights=floats, rollout_ids=ints,
                       ref_logprobs=floats if with_ref_logprobs else None,
                       recomputed_logprobs=floats if with_recomputed_logprobs else None,
                       prefix_ids=ints if with_prefix_ids else None)


def _memory(compiled) -> dict:
    """Per-chip bytes of a compiled executable: arguments, outputs, aliased (donated), peak and
    temporaries (= peak - live arguments and outputs). For TPU, XLA reports the peak of its heap
    simulation (what its own out-of-memory check uses); elsewhere the peak is the sum of the
    live parts and the temporary allocation."""
    stats = compiled.memory_analysis()
    arguments, outputs = stats.argument_size_in_bytes, stats.output_size_in_bytes
    aliased = stats.alias_size_in_bytes
    live_io = arguments + outputs - aliased
    peak = int(getattr(stats, "peak_memory_in_bytes", 0) or 0)
    if peak <= 0:
        peak = live_io + stats.temp_size_in_bytes
    return {"arguments": int(arguments), "outputs": int(outputs), "aliased": int(aliased),
            "temporaries": int(max(peak - live_io, 0)), "peak": peak}


_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def _compile(lowered):
    """(compiled, None), or (None, XLA's message) when the program does not fit in HBM: compiling
    for TPU refuses a program whose temporaries exceed the chip's memory."""
    try:
        return lowered.compile(), None
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return None, str(error).strip()


def _out_of_memory(message: str, live_arguments: int) -> dict:
    """Per-chip figures from XLA's out-of-memory message: the temporaries it needed and the HBM
    it had ("... HLO temporaries (24.46G) exceeds available HBM (15.75G)", or "Used X of Y hbm")."""
    def size(number, unit):
        return int(float(number) * _UNITS[unit])

    first_line = message.splitlines()[0][:500]
    found = re.search(r"temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)",
                      message)
    if found:
        temporaries, available = size(*found.group(1, 2)), size(*found.group(3, 4))
        return {"compiled": False, "xla_message": first_line, "temporaries": temporaries,
                "xla_available_hbm": available, "arguments": live_arguments,
                "peak": live_arguments + temporaries}
    found = re.search(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm", message)
    used = size(*found.group(1, 2)) if found else None
    return {"compiled": False, "xla_message": first_line, "arguments": live_arguments,
            "xla_available_hbm": size(*found.group(3, 4)) if found else None,
            "peak": max(used or 0, live_arguments),
            "temporaries": max((used or 0) - live_arguments, 0)}


def _cost_dict(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return cost or {}


def _xla_flops(compiled) -> float | None:
    cost = _cost_dict(compiled)
    return float(cost["flops"]) if "flops" in cost else None


def _cost(compiled) -> dict:
    """XLA's cost analysis of the compiled per-chip program: FLOPs, HBM bytes accessed,
    transcendentals. Estimates, with two blind spots: a while loop's body (the layer scan, the
    micro-batch scan) is counted once, and a Mosaic (Pallas) kernel declares no cost here, so it
    counts nothing."""
    cost = _cost_dict(compiled)
    return {name: float(cost[key]) for name, key in (
        ("flops", "flops"), ("bytes_accessed", "bytes accessed"),
        ("transcendentals", "transcendentals")) if key in cost}


def train_step_plan(inputs: PlanInputs, mesh, graphdef, params, frozen) -> dict:
    """Compiles make_train_step's jitted step for `mesh` and accounts its per-chip memory."""
    step_config = inputs.step
    tx = step_lib.make_optimizer(inputs.optimizer)
    state, shardings = abstract_train_state(params, frozen, tx, mesh)
    multiple = step_config.row_multiple(mesh)
    rows = -(-inputs.rows // multiple) * multiple
    batch = abstract_batch(rows, inputs.row_length, mesh, step_config.loss.kl_coef > 0,
                           step_config.loss.rollout_correction != "off", inputs.share_prompts)
    run = step_lib.make_train_step(graphdef, tx, step_config, mesh, shardings)
    start, cpu_start = time.perf_counter(), time.process_time()
    # The step names its mesh (TPU devices), so `auto` resolves for the TPU, not this host.
    with attention_dispatch.record() as uses:
        lowered = run.jitted.lower(state, batch)
    compiled, error = _compile(lowered)
    compile_s, compile_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start

    param_bytes = accounting.per_chip_bytes(state.params)  # the trained ones (LoRA: adapters)
    parts = dict(parameters=param_bytes + accounting.per_chip_bytes(state.frozen),
                 optimizer_state=accounting.per_chip_bytes(state.opt_state),
                 batch=accounting.per_chip_bytes(batch),
                 # The gradient accumulator: a param-dtype copy of the trained parameters,
                 # counted in the temporaries.
                 gradients=param_bytes)
    if compiled is not None:
        memory = dict(_memory(compiled), compiled=True)
    else:  # the donated state is aliased to the new one: arguments are the live inputs
        memory = _out_of_memory(error, accounting.per_chip_bytes((state, batch)))
    memory.update(parts)
    memory["activations_and_other_temporaries"] = max(memory["temporaries"] - param_bytes, 0)
    tokens = rows * inputs.row_length * step_config.ppo_epochs
    flops = accounting.train_step_flops(inputs.model, tokens, inputs.row_length,
                                        step_config.remat)
    chips = mesh.devices.size
    return {
        "rows": rows, "row_length": inputs.row_length, "tokens": tokens,
        "attention": attention_dispatch.implementations(uses),
        "shared_prompts": inputs.share_prompts,
        "rows_per_micro_batch_per_chip": rows / (step_config.micro_batches
                                                 * step_config.ppo_mini_batches
                                                 * mesh.shape["data"] * mesh.shape["fsdp"]),
        "micro_batches": step_config.micro_batches,
        "ppo_mini_batches": step_config.ppo_mini_batches, "ppo_epochs": step_config.ppo_epochs,
        "remat": step_config.remat, "scan_layers": step_config.scan_layers,
        "temperature": step_config.temperature, "compile_s": round(compile_s, 1),
        "compile_cpu_s": round(compile_cpu_s, 1),
        "memory_per_chip": memory,
        "model_flops": flops["model_flops"], "hardware_flops": flops["hardware_flops"],
        "attention_flops_share": round(flops["attention_share"], 3),
        "xla_flops_per_chip_loop_bodies_once": _xla_flops(compiled) if compiled else None,
        "cost_analysis_per_chip_loop_bodies_once": _cost(compiled) if compiled else None,
        "model_flops_per_chip": flops["model_flops"] / chips,
    }


def decode_step_plan(inputs: PlanInputs, mesh, graphdef, params, frozen,
                     slots: int | None = None) -> dict:
    """Compiles one sampler decode step (`CausalLM.decode` over every slot, the cache
    sharded as the sampler shards it) and accounts the KV cache per chip."""
    param_sh = parallel.param_shardings(params, mesh)
    frozen_sh = parallel.param_shardings(frozen, mesh)  # empty, or a LoRA run's base
    slots, max_len = slots or inputs.decode_slots, inputs.max_context
    shards = math.prod(mesh.shape[a] for a in parallel.BATCH_AXES)
    cache = jax.eval_shape(lambda: _empty_cache(inputs, slots, shards))
    cache_sh = parallel.cache_shardings(cache, mesh)
    slot_sh = NamedSharding(mesh, parallel.fit_spec(P(parallel.BATCH_AXES), (slots,), mesh))

    def decode(params, frozen, tokens, cache, active):
        with kernel_mesh(mesh):  # `auto` resolves for the mesh's (TPU) devices
            return nnx.merge(graphdef, params, frozen).decode(tokens, cache, active)

    jitted = jax.jit(decode, in_shardings=(param_sh, frozen_sh, slot_sh, cache_sh, slot_sh),
                     out_shardings=(None, cache_sh), donate_argnums=3)
    args = (_with_shardings(params, param_sh), _with_shardings(frozen, frozen_sh),
            jax.ShapeDtypeStruct((slots,), jnp.int32, sharding=slot_sh),
            _with_shardings(cache, cache_sh),
            jax.ShapeDtypeStruct((slots,), jnp.bool_, sharding=slot_sh))
    start, cpu_start = time.perf_counter(), time.process_time()
    with attention_dispatch.record() as uses:
        lowered = jitted.lower(*args)
    compiled, error = _compile(lowered)
    compile_s, compile_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    if compiled is not None:
        memory = dict(_memory(compiled), compiled=True)
    else:
        memory = _out_of_memory(error, accounting.per_chip_bytes(args))
    kv = accounting.per_chip_bytes(args[3])
    memory.update(parameters=accounting.per_chip_bytes(args[:2]), kv_cache=kv)
    slot_shards = math.prod(mesh.shape[a] for a in parallel.BATCH_AXES)
    slot_shards = slot_shards if slots % slot_shards == 0 else 1
    paged = inputs.kv_cache == "paged"
    return {"slots": slots, "max_context": max_len, "kv_cache": inputs.kv_cache,
            **({"kv_page_size": inputs.kv_page_size,
                "kv_pages": inputs.kv_pool_pages(slots, shards),
                "kv_pools": shards,
                "kv_mean_tokens_per_slot": inputs.kv_pool_pages(slots, shards)
                * inputs.kv_page_size / slots} if paged else {}),
            "attention": attention_dispatch.implementations(uses),
            "cost_analysis_per_chip": _cost(compiled) if compiled else None,
            "compile_s": round(compile_s, 1),
            "compile_cpu_s": round(compile_cpu_s, 1),
            "memory_per_chip": memory,
            "kv_bytes_per_slot_per_chip": kv / max(slots / slot_shards, 1),
            "slot_shards": slot_shards,
            "kv_cache_total": accounting.total_bytes(cache)}


def _empty_cache(inputs: PlanInputs, slots: int, batch_shards: int = 1):
    """The sampler's KV cache for `slots` slots: dense, or a paged pool (`kv_pool_pages`), one
    per batch shard."""
    if inputs.kv_cache != "paged":
        return init_cache(inputs.model, slots, inputs.max_context)
    model = inputs.model
    return paged_cache.init_paged_cache(
        model.num_hidden_layers, model.num_key_value_heads, model.head_dim, slots,
        inputs.max_context, inputs.kv_pool_pages(slots, batch_shards), inputs.kv_page_size,
        model.dtype, shards=batch_shards)


def _decode_fit(ds: dict, hbm: int, resident_state: int) -> dict:
    """Whether the decode step fits beside the optimizer state, and how many slots would: all
    of the step's memory but the parameters is taken to grow with the slots (the KV cache, and
    temporaries of the cache's size and of [slots, vocab] logits; a paged pool at the same mean
    fill a slot)."""
    memory = ds["memory_per_chip"]
    ds["peak_with_optimizer_state"] = memory["peak"] + resident_state
    ds["fits"] = bool(memory["compiled"]) and ds["peak_with_optimizer_state"] <= hbm
    slots_per_shard = ds["slots"] / ds["slot_shards"]
    per_slot = (memory["peak"] - memory["parameters"]) / slots_per_shard
    room = hbm - memory["parameters"] - resident_state
    ds["bytes_per_slot_per_chip"] = per_slot
    ds["slots_that_fit"] = max(int(room // per_slot), 0) * ds["slot_shards"] if per_slot > 0 else 0
    return ds


def _train_fit(ts: dict, inputs: PlanInputs, topology: Topology) -> dict:
    ts["fits"] = bool(ts["memory_per_chip"]["compiled"]) and \
        ts["memory_per_chip"]["peak"] <= topology.chip.hbm_bytes
    ts["step_time_s_at_mfu"] = ts["model_flops"] / (topology.chips
                                                     * topology.chip.peak_bf16_flops * inputs.mfu)
    return ts


def _train_plans(inputs: PlanInputs, topology: Topology, mesh, graphdef, params, frozen,
                 search_micro_batches: bool) -> dict:
    """train_step; with the search, the micro-batch counts tried and the first that fits."""
    ts = _train_fit(train_step_plan(inputs, mesh, graphdef, params, frozen), inputs, topology)
    out = {"train_step": ts}
    attempt = inputs
    while search_micro_batches and not ts["fits"] and ts["rows_per_micro_batch_per_chip"] > 1:
        attempt = dataclasses.replace(attempt, step=dataclasses.replace(
            attempt.step, micro_batches=attempt.step.micro_batches * 2))
        ts = _train_fit(train_step_plan(attempt, mesh, graphdef, params, frozen), attempt,
                        topology)
        out.setdefault("micro_batches_tried", []).append(
            {"micro_batches": ts["micro_batches"], "fits": ts["fits"],
             "peak": ts["memory_per_chip"]["peak"], "compile_s": ts["compile_s"]})
    if ts["fits"] and ts is not out["train_step"]:
        out["train_step_fitting"] = ts
    return out


def _decode_estimate(ds: dict, topology: Topology) -> None:
    """An estimate of the decode step's time from XLA's cost analysis: its layers are unrolled
    and it runs no Pallas kernel, so the analysis covers the whole program; the slower of its
    FLOPs at the chip's peak and its bytes at the HBM bandwidth (no overlap loss, no latency).
    None with a Pallas kernel (paged_tpu): the analysis does not see the pages it reads."""
    if any(not name.startswith("xla") for name in ds.get("attention", {}).values()):
        return
    cost = ds.get("cost_analysis_per_chip")
    if cost and "flops" in cost and "bytes_accessed" in cost:
        ds["step_time_s_estimate_cost_analysis"] = max(
            cost["flops"] / topology.chip.peak_bf16_flops,
            cost["bytes_accessed"] / topology.chip.hbm_bandwidth)


def _decode_plans(inputs: PlanInputs, topology: Topology, mesh, graphdef, params, frozen,
                  attempts: int) -> dict:
    """decode_step; when the configured slots do not fit, the counts tried and the largest that
    fits: each compile's estimate is the next count (the estimate is linear in the slots, the
    temporaries are not)."""
    hbm = topology.chip.hbm_bytes
    # During rollouts the optimizer state stays on the chips beside the sampler.
    resident = accounting.per_chip_bytes(abstract_train_state(
        params, frozen, step_lib.make_optimizer(inputs.optimizer), mesh)[0].opt_state)
    ds = _decode_fit(decode_step_plan(inputs, mesh, graphdef, params, frozen), hbm, resident)
    memory = ds["memory_per_chip"]
    # A decode step reads every parameter and the whole cache once: an HBM-bandwidth bound.
    ds["step_time_s_lower_bound"] = (memory["parameters"] + memory["kv_cache"]) / \
        topology.chip.hbm_bandwidth
    _decode_estimate(ds, topology)
    out, shards = {"decode_step": ds}, ds["slot_shards"]
    fitting, tried = (ds["slots_that_fit"] // shards) * shards, set()
    while not ds["fits"] and fitting >= shards and fitting not in tried and len(tried) < attempts:
        tried.add(fitting)
        attempt = _decode_fit(decode_step_plan(inputs, mesh, graphdef, params, frozen,
                                               slots=fitting), hbm, resident)
        _decode_estimate(attempt, topology)
        out.setdefault("decode_slots_tried", []).append(
            {"slots": fitting, "fits": attempt["fits"],
             "peak_with_optimizer_state": attempt["peak_with_optimizer_state"],
             "compile_s": attempt["compile_s"]})
        best = out.get("decode_step_fitting_slots")
        if attempt["fits"] and (best is None or attempt["slots"] > best["slots"]):
            out["decode_step_fitting_slots"] = attempt
        fitting = (attempt["slots_that_fit"] // shards) * shards
        if attempt["fits"] and fitting <= attempt["slots"]:
            break
        if not attempt["fits"] and best is not None:
            break  # the previous count fitted and this one does not: that is the answer
        fitting = min(fitting, ds["slots"] - shards)
    return out


def make_plan(inputs: PlanInputs, topology: Topology, *, decode: bool = True,
              train: bool = True, search_micro_batches: bool = False,
              decode_slot_attempts: int = 3) -> dict:
    """The whole plan as a JSON-ready dict: both steps' memory against the chip's HBM, the train
    step's FLOPs and its time at `inputs.mfu`, the decode slots that fit. With
    search_micro_batches, a train step that does not fit is compiled again with twice the
    micro-batches (the same update, less activation memory) until it fits or a micro-batch is
    one row per chip; the first that fits is `train_step_fitting`. Configured decode slots that
    do not fit are followed by up to `decode_slot_attempts` compiles of the count estimated to
    fit; the largest that fits is `decode_step_fitting_slots`."""
    devices = topology.devices()
    mesh = parallel.make_mesh(inputs.mesh_shape, devices=devices)
    shards = math.prod(mesh.shape[a] for a in parallel.BATCH_AXES)
    refusal = paged_mesh_refusal(inputs.decode_slots, inputs.kv_pool_pages(inputs.decode_slots),
                                 shards)
    if decode and inputs.kv_cache == "paged" and refusal:
        raise ValueError(refusal)
    graphdef, params, frozen = abstract_model(inputs.model, inputs.lora)
    chip = topology.chip
    plan = {
        "topology": topology.name, "libtpu_topology": topology.libtpu_name,
        "chips": topology.chips, "hosts": len({d.process_index for d in devices}),
        "hbm_per_chip": chip.hbm_bytes, "peak_bf16_flops_per_chip": chip.peak_bf16_flops,
        "mesh": dict(mesh.shape),
        "model": {"parameters": int(sum(math.prod(x.shape)
                                        for x in jax.tree.leaves((params, frozen)))),
                  "trained_parameters": int(sum(math.prod(x.shape)
                                                for x in jax.tree.leaves(params))),
                  "lora": None if inputs.lora is None else dataclasses.asdict(inputs.lora),
                  "dtype": inputs.model.dtype, "param_dtype": inputs.model.param_dtype,
                  "layers": inputs.model.num_hidden_layers,
                  "vocab_size": inputs.model.vocab_size},
        "mfu": inputs.mfu,
    }
    if train:
        plan.update(_train_plans(inputs, topology, mesh, graphdef, params, frozen,
                                 search_micro_batches))
    if decode:
        plan.update(_decode_plans(inputs, topology, mesh, graphdef, params, frozen,
                                  decode_slot_attempts))
    return plan


def _gib(x) -> str:
    return f"{x / 2**30:.2f}"


def _attention(step: dict, path: str) -> str:
    return step.get("attention", {}).get(path, "?")


def _train_lines(ts: dict, mfu: float, title: str) -> list[str]:
    m = ts["memory_per_chip"]
    verdict = "fits" if ts["fits"] else "DOES NOT FIT"
    if not m["compiled"]:
        verdict += f" (XLA: {m['xla_message']})"
    return [
        f"{title}: {ts['rows']} rows x {ts['row_length']} tokens, {ts['micro_batches']} "
        f"micro-batches, remat={ts['remat']}, scan_layers={ts['scan_layers']}, attention "
        f"{_attention(ts, 'train')}, compiled in {ts['compile_s']} s",
        f"  per chip GiB: parameters {_gib(m['parameters'])}, optimizer state "
        f"{_gib(m['optimizer_state'])}, batch {_gib(m['batch'])}, gradients "
        f"{_gib(m['gradients'])}, activations+other temporaries "
        f"{_gib(m['activations_and_other_temporaries'])}; arguments {_gib(m['arguments'])}, "
        f"temporaries {_gib(m['temporaries'])}, peak {_gib(m['peak'])} -> {verdict}",
        f"  FLOPs per step {ts['model_flops']:.3e} (model), {ts['hardware_flops']:.3e} "
        f"(with recomputation); at MFU {mfu:.0%}: {ts['step_time_s_at_mfu']:.1f} s"]


def _decode_lines(ds: dict, title: str) -> list[str]:
    m = ds["memory_per_chip"]
    verdict = "fits" if ds["fits"] else "DOES NOT FIT"
    if not m["compiled"]:
        verdict += f" (XLA: {m['xla_message']})"
    cache = (f", paged: {ds['kv_pages']} pages of {ds['kv_page_size']} tokens (a mean "
             f"{ds['kv_mean_tokens_per_slot']:,.0f} a slot)" if ds.get("kv_cache") == "paged"
             else "")
    return [
        f"{title}: {ds['slots']} slots x {ds['max_context']} tokens{cache}, attention "
        f"{_attention(ds, 'decode')}, compiled in {ds['compile_s']} s",
        f"  per chip GiB: parameters {_gib(m['parameters'])}, KV cache {_gib(m['kv_cache'])}, "
        f"peak {_gib(m['peak'])}, + optimizer state {_gib(ds['peak_with_optimizer_state'])} -> "
        f"{verdict}; slots that fit: {ds['slots_that_fit']}"] + (
        [f"  ~{ds['step_time_s_estimate_cost_analysis'] * 1e3:.1f} ms per decode step (estimate "
         "from XLA's cost analysis: FLOPs at peak, bytes at HBM bandwidth)"]
        if "step_time_s_estimate_cost_analysis" in ds else [])


def summary_lines(plan: dict) -> list[str]:
    """The plan in a few lines for the terminal."""
    lines = [f"{plan.get('config', '')} on {plan['topology']} ({plan['chips']} chips, "
             f"{plan['hosts']} hosts, mesh {plan['mesh']}), {plan['model']['parameters']/1e9:.2f}B "
             f"parameters; HBM {_gib(plan['hbm_per_chip'])} GiB per chip"]
    if "train_step" in plan:
        lines += _train_lines(plan["train_step"], plan["mfu"], "train step")
    for tried in plan.get("micro_batches_tried", []):
        lines.append(f"  retried with {tried['micro_batches']} micro-batches: peak "
                     f"{_gib(tried['peak'])} GiB, {'fits' if tried['fits'] else 'does not fit'}")
    if "train_step_fitting" in plan:
        lines += _train_lines(plan["train_step_fitting"], plan["mfu"], "train step that fits")
    if "decode_step" in plan:
        lines += _decode_lines(plan["decode_step"], "decode step")
        lines.append(f"  >= {plan['decode_step']['step_time_s_lower_bound'] * 1e3:.1f} ms per "
                     "decode step (HBM bandwidth)")

    if "decode_step_fitting_slots" in plan:
        lines += _decode_lines(plan["decode_step_fitting_slots"], "decode step, slots that fit")
    check = plan.get("train_fit_check")
    if check:
        lines.append("train's check before any work: " + (
            f"passes ({check['slots_that_fit']} decode slots fit)" if check["passes"]
            else "refuses: " + " | ".join(check["refused"])))
    return lines


def plan_name(config_path: str, topology: str) -> str:
    stem = config_path.rsplit("/", 1)[-1].split(":", 1)[0].removesuffix(".py")
    return f"plan_{stem}_{topology.replace(':', '_')}"


def as_json_ready(plan: dict) -> dict:
    return jax.tree.map(lambda x: x.item() if isinstance(x, np.generic) else x, plan)
