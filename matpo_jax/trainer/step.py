"""The sharded, jitted update: RL (clipped surrogate) or SFT (cross-entropy), one function.

State is an explicit pytree (`TrainState`: params, optimizer state, counters, RNG) so it flows
through jit and Orbax unchanged. Parameters and optimizer state are sharded by the regex partition
rules; the packed batch is sharded over ("data", "fsdp") on its row axis.

Inside one call: the rows are split into `ppo_mini_batches` mini-batches (one optimizer step each,
repeated for `ppo_epochs` epochs; 1 x 1 by default = one optimizer step per RL step) and every
mini-batch into `micro_batches` micro-batches whose gradients are summed in a `lax.scan`. Because
the loss is a weighted sum with weights fixed on the host over the whole batch, the sum over
micro-batches and devices equals the whole-batch loss exactly.

Row order: micro-batch k of mini-batch m holds rows {j * M + m * micro_batches + k} (M = mini x
micro), i.e. the batch is viewed as [rows_per_micro, M] and then transposed. With the row axis
split in contiguous blocks over devices, that keeps every micro-batch spread over all devices.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from matpo_jax import parallel
from matpo_jax.model.kernel_sharding import kernel_mesh
from matpo_jax.model import lora as lora_lib
from matpo_jax.model.remat import REMAT_POLICIES
from matpo_jax.trainer import logprobs as logprobs_lib
from matpo_jax.trainer import loss as loss_lib
from matpo_jax.trainer.packing import PackedBatch

OBJECTIVES = ("rl", "sft")
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "warmup_constant", "warmup_cosine", "warmup_linear")


# ----------------------------------------------------------------------------- configuration

@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    optimizer: str = "adamw"  # adamw | sgd
    learning_rate: float = 1e-5
    schedule: str = "constant"  # constant | warmup_constant | warmup_cosine | warmup_linear
    warmup_steps: int = 0
    decay_steps: int = 1000  # warmup_cosine/linear: optimizer steps from warmup's end to the floor
    end_lr_ratio: float = 0.0  # warmup_cosine/linear: final lr / peak lr
    weight_decay: float = 0.01  # decoupled (AdamW); only on matrices, never on norm scales
    adam_b1: float = 0.9  # rl.adam_b1 (the other phases keep these)
    adam_b2: float = 0.999  # rl.adam_b2
    eps: float = 1e-8
    grad_clip: float = 1.0  # global-norm clip; <= 0 disables

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"OptimizerConfig.optimizer={self.optimizer!r}, "
                             f"expected one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"OptimizerConfig.schedule={self.schedule!r}, "
                             f"expected one of {SCHEDULES}")


@dataclasses.dataclass(frozen=True)
class TrainStepConfig:
    objective: str = "rl"  # rl | sft
    loss: loss_lib.LossConfig = dataclasses.field(kw_only=True)  # required: no default loss
    micro_batches: int = 1  # gradient accumulation steps per optimizer step
    ppo_mini_batches: int = 1  # optimizer steps per epoch over the RL batch
    ppo_epochs: int = 1  # passes over the RL batch
    # RL log-probs are taken at the rollouts' sampling temperature (softmax(logits / T)), the
    # distribution the sampler recorded old log-probs under; 1 for greedy rollouts.
    temperature: float = 1.0
    # Workers' log-prob temperature when they sample at one of their own (None: `temperature`).
    worker_temperature: float | None = None
    remat: str = "none"  # per-decoder-layer rematerialisation (model.remat.REMAT_POLICIES)
    scan_layers: bool = False  # decoder layers as one lax.scan (compile time; same numbers)
    logprob_seq_block: int = logprobs_lib.SEQ_BLOCK  # blockwise log-softmax tiles
    logprob_vocab_block: int = logprobs_lib.VOCAB_BLOCK
    # RL: also report the gradient norm of the planner tokens' and the worker tokens' share of
    # the loss (one more forward and backward per mini-batch: the planner share; the worker
    # share is the rest, the loss being a sum over tokens).
    role_grad_norms: bool = False

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"TrainStepConfig.objective={self.objective!r}, expected {OBJECTIVES}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"TrainStepConfig.remat={self.remat!r}, expected one of "
                             f"{tuple(REMAT_POLICIES)}")
        if not self.temperature > 0:
            raise ValueError(f"TrainStepConfig.temperature must be > 0, got {self.temperature}")
        if self.worker_temperature is not None and not self.worker_temperature > 0:
            raise ValueError(f"TrainStepConfig.worker_temperature must be > 0, got "
                             f"{self.worker_temperature}")
        for name in ("micro_batches", "ppo_mini_batches", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainStepConfig.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def optimizer_steps_per_call(self) -> int:
        return self.ppo_mini_batches * self.ppo_epochs

    def row_multiple(self, mesh: Mesh | None = None) -> int:
        """Rows of a packed batch must be a multiple of this (pass to pack_sequences)."""
        devices = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
        return self.micro_batches * self.ppo_mini_batches * devices


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
    """lr of the optimizer update with 0-based index `count` (optax's count before the update).

    Warmup is shifted by one so the first update already moves: update k of a w-step warmup uses
    (k + 1) / w of the peak, never 0."""
    lr, warmup = config.learning_rate, config.warmup_steps
    if config.schedule == "constant":
        return optax.constant_schedule(lr)
    if config.schedule == "warmup_constant":
        base = optax.join_schedules(
            [optax.linear_schedule(0.0, lr, max(warmup, 1)), optax.constant_schedule(lr)], [warmup])
    elif config.schedule == "warmup_linear":
        base = optax.join_schedules(
            [optax.linear_schedule(0.0, lr, max(warmup, 1)),
             optax.linear_schedule(lr, lr * config.end_lr_ratio, config.decay_steps)], [warmup])
    else:
        base = optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=lr, warmup_steps=warmup,
            decay_steps=warmup + config.decay_steps, end_value=lr * config.end_lr_ratio)
    return lambda count: base(count + 1)


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW (or plain SGD) with the configured schedule.

    SGD's update is lr x gradient, so two runs that compute the same gradients up to float
    rounding end with parameters equal up to that rounding; Adam's divides each coordinate by its
    own RMS, which turns a gradient of pure rounding noise into an lr-sized step of random sign.
    Exactness tests across topologies therefore train with SGD."""
    schedule = learning_rate_schedule(config)
    matrices = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    if config.optimizer == "sgd":
        update = optax.chain(optax.add_decayed_weights(config.weight_decay, mask=matrices),
                             optax.sgd(schedule))
    else:
        update = optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.eps,
                             weight_decay=config.weight_decay, mask=matrices)
    if config.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(config.grad_clip), update)
    return update


# ----------------------------------------------------------------------------- state

@flax.struct.dataclass
class TrainState:
    params: Any  # nnx.State of the trained variables: every nnx.Param, or the LoRA adapters
    opt_state: Any
    frozen: Any  # the rest of the model state (empty, or with LoRA the frozen base parameters)
    step: jax.Array  # train_step calls (RL steps)
    optimizer_steps: jax.Array  # optimizer updates applied
    skipped_steps: jax.Array  # updates skipped: non-finite loss, gradient or updated parameters
    nonfinite_streak: jax.Array  # consecutive train_step calls that skipped an update
    rng: jax.Array


def state_shardings(state_shapes: TrainState, tx: optax.GradientTransformation, mesh: Mesh,
                    rules=None) -> TrainState:
    """NamedShardings for every leaf: parameters (trained, or the frozen base of a LoRA run) by
    the partition rules, optimizer moments like their parameter, counters and RNG replicated."""
    replicated = NamedSharding(mesh, P())
    param_sh = parallel.param_shardings(state_shapes.params, mesh, rules)
    opt_sh = optax.tree_map_params(tx, lambda _, sh: sh, state_shapes.opt_state, param_sh,
                                   transform_non_params=lambda _: replicated)
    return TrainState(params=param_sh, opt_state=opt_sh,
                      frozen=parallel.param_shardings(state_shapes.frozen, mesh, rules),
                      step=replicated, optimizer_steps=replicated, skipped_steps=replicated,
                      nonfinite_streak=replicated, rng=replicated)


def fresh_train_state(params, frozen, tx: optax.GradientTransformation, seed: int = 0
                      ) -> TrainState:
    """The TrainState before the first step (traceable: the plan command builds it from shapes)."""
    return TrainState(params=params, opt_state=tx.init(params), frozen=frozen,
                      step=jnp.zeros((), jnp.int32), optimizer_steps=jnp.zeros((), jnp.int32),
                      skipped_steps=jnp.zeros((), jnp.int32),
                      nonfinite_streak=jnp.zeros((), jnp.int32),
                      rng=jax.random.key_data(jax.random.key(seed)))


def init_train_state(model: nnx.Module, tx: optax.GradientTransformation, mesh: Mesh, *,
                     rules=None, seed: int = 0):
    """Splits the model and builds a sharded TrainState. Returns (graphdef, state, shardings).
    A model with LoRA adapters trains the adapters alone: the base is frozen (no gradient, no
    optimizer state, not in checkpoints)."""
    graphdef, params, frozen = lora_lib.split_trainable(model)
    build = functools.partial(fresh_train_state, tx=tx, seed=seed)
    shardings = state_shardings(jax.eval_shape(build, params, frozen), tx, mesh, rules)
    state = jax.jit(build, out_shardings=shardings)(params, frozen)
    return graphdef, state, shardings


# ----------------------------------------------------------------------------- the step

def _split_rows(batch: PackedBatch, mini: int, micro: int, mesh: Mesh) -> PackedBatch:
    """[rows, T] -> [mini, micro, rows_per_micro, T], each micro-batch spread over all devices."""
    spec = P(None, None, parallel.BATCH_AXES)

    def split(x):
        per_micro = x.shape[0] // (mini * micro)
        x = x.reshape(per_micro, mini, micro, *x.shape[1:])
        x = jnp.moveaxis(x, 0, 2)
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    return jax.tree.map(split, batch)


def _on_mesh(fn: Callable, mesh: Mesh) -> Callable:
    """fn traced with `mesh` named as the program's mesh: attention kernels run per shard of it
    (XLA does not partition a Pallas call) and `auto` resolves for its devices' platform."""
    @functools.wraps(fn)
    def traced(*args):
        with kernel_mesh(mesh):
            return fn(*args)

    return traced


def _tree_where(pred, on_true, on_false):
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def tree_all_finite(tree) -> jax.Array:
    """One boolean: every floating-point leaf of `tree` is finite."""
    leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def _accumulated_gradients(graphdef, config: TrainStepConfig, shardings: TrainState) -> Callable:
    """(params, frozen, mini_batch [micro, rows, T]) -> (summed grads, loss, metric sums)."""
    mini = config.ppo_mini_batches
    # Setwise sets: micro-batch rows are mini x micro global rows apart (_split_rows).
    loss_config = dataclasses.replace(config.loss,
                                      set_row_stride=mini * config.micro_batches)

    def micro_loss(params, frozen, batch):
        model = nnx.merge(graphdef, params, frozen)
        loss, sums = loss_lib.model_objective(
            model, batch, loss_config, objective=config.objective,
            temperature=config.temperature, worker_temperature=config.worker_temperature,
            remat=config.remat, scan_layers=config.scan_layers,
            seq_block=config.logprob_seq_block, vocab_block=config.logprob_vocab_block)
        # Each mini-batch is one slice of the whole-batch objective; scale it back to full size.
        return loss * mini, (loss, sums)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def mini_batch_grads(params, frozen, mini_batch):
        first = jax.tree.map(lambda x: x[0], mini_batch)
        _, (_, sum_shapes) = jax.eval_shape(micro_loss, params, frozen, first)
        # The gradient accumulator lives where its parameter lives.
        zero_grads = jax.lax.with_sharding_constraint(jax.tree.map(jnp.zeros_like, params),
                                                      shardings.params)
        zeros = (zero_grads, jnp.zeros((), jnp.float32),
                 jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sum_shapes))

        def contribution(micro_batch):
            (_, (micro_value, micro_sums)), micro_grads = grad_fn(params, frozen, micro_batch)
            return micro_grads, micro_value, micro_sums

        def accumulate(carry, micro_batch):
            # An all-padding micro-batch adds exact zeros: skip its forward and backward
            # (packing.fill_micro_batches_first leaves the padding to the last micro-batches).
            empty = ~jnp.any(micro_batch.segment_ids != 0)
            part = jax.lax.cond(empty, lambda _: zeros, contribution, micro_batch)
            return jax.tree.map(jnp.add, carry, part), None

        return jax.lax.scan(accumulate, zeros, mini_batch)[0]

    return mini_batch_grads


def make_gradient_fn(graphdef, config: TrainStepConfig, mesh: Mesh, shardings: TrainState):
    """jitted (state, batch) -> (loss, grads, metrics) over the whole batch, accumulated over
    `config.micro_batches` exactly as the train step does (ppo_mini_batches must be 1). For
    tests, debugging and gradient statistics; applies no update."""
    if config.ppo_mini_batches != 1:
        raise ValueError("make_gradient_fn needs ppo_mini_batches == 1")
    accumulate = _accumulated_gradients(graphdef, config, shardings)

    def grads_of(state: TrainState, batch: PackedBatch):
        mini_batch = jax.tree.map(lambda x: x[0], _split_rows(batch, 1, config.micro_batches, mesh))
        grads, loss, sums = accumulate(state.params, state.frozen, mini_batch)
        return loss, grads, loss_lib.finalize_metrics(sums)

    batch_sharding = parallel.batch_sharding(mesh)
    jitted = jax.jit(_on_mesh(grads_of, mesh), in_shardings=(shardings, batch_sharding))
    return lambda state, batch: jitted(state, jax.device_put(batch, batch_sharding))


def make_logprob_fn(graphdef, config: TrainStepConfig, mesh: Mesh, shardings: TrainState,
                    adapters: bool = True):
    """(params, frozen, batch) -> numpy [rows, T] log-probs of the batch's tokens under `params`,
    computed as the loss computes them, at the loss mask's positions (0 elsewhere: the KL term and
    the rollout correction read no others), a micro-batch at a time like the train step. For the
    frozen reference policy of the KL term and the rollout correction's recomputed log-probs.
    Only the scored positions go through the output head, as in the train step
    (`logprobs.scored_next_token_logprobs`): the head and its log-softmax over every position cost
    about as much as the decoder of this pass on a small model.
    adapters=False: every token with its LoRA adapter off (lora.ADAPTERS_OFF), i.e. the frozen
    base of a LoRA model: the KL reference of a LoRA run, from the same parameter tree."""
    micro = config.micro_batches

    def logprobs(params, frozen, batch: PackedBatch):
        model = nnx.merge(graphdef, params, frozen)
        split = jax.tree.map(lambda x: x[0], _split_rows(batch, 1, micro, mesh))

        def one(micro_batch):
            temperature = loss_lib.role_temperatures(micro_batch.role_ids, config.temperature,
                                                     config.worker_temperature)
            return logprobs_lib.score_tokens(
                model, micro_batch.tokens, micro_batch.positions, micro_batch.segment_ids,
                temperature=temperature, seq_block=config.logprob_seq_block,
                vocab_block=config.logprob_vocab_block, scored=micro_batch.loss_mask != 0,
                scored_capacity=loss_lib.scored_capacity(micro_batch.tokens.shape[1]),
                prefix_ids=micro_batch.prefix_ids,
                roles=(micro_batch.role_ids if adapters
                       else jnp.full_like(micro_batch.role_ids, lora_lib.ADAPTERS_OFF)))[0]

        def one_unless_empty(micro_batch):
            return jax.lax.cond(jnp.any(micro_batch.segment_ids != 0), one,
                                lambda b: jnp.zeros(b.tokens.shape, jnp.float32), micro_batch)

        per_micro = jax.lax.map(one_unless_empty, split)  # [micro, rows_per_micro, T]
        # Undo _split_rows: row j * micro + k is row j of micro-batch k.
        return jnp.moveaxis(per_micro, 0, 1).reshape(batch.tokens.shape)

    batch_sharding = parallel.batch_sharding(mesh)
    jitted = jax.jit(_on_mesh(logprobs, mesh),
                     in_shardings=(shardings.params, shardings.frozen, batch_sharding))

    def run(params, frozen, batch: PackedBatch):
        batch = dataclasses.replace(batch, ref_logprobs=None, recomputed_logprobs=None)
        out = jitted(params, frozen, jax.device_put(batch, batch_sharding))
        # A multi-process batch's log-probs stay a global array (no process holds all rows).
        return np.asarray(out) if out.is_fully_addressable else out

    return run


def make_train_step(graphdef, tx: optax.GradientTransformation, config: TrainStepConfig,
                    mesh: Mesh, shardings: TrainState,
                    lr_schedule: optax.Schedule | None = None) -> Callable:
    """step(state, batch: PackedBatch of numpy or jax arrays) -> (state, metrics)."""
    mini, micro, epochs = config.ppo_mini_batches, config.micro_batches, config.ppo_epochs
    mini_batch_grads = _accumulated_gradients(graphdef, config, shardings)
    planner_grads = None
    if config.role_grad_norms and config.objective == "rl":
        planner_only = dataclasses.replace(config, loss=dataclasses.replace(config.loss,
                                                                            weight_role=0))
        planner_grads = _accumulated_gradients(graphdef, planner_only, shardings)

    def optimizer_step(carry, mini_batch):
        params, opt_state, frozen, skipped = carry
        grads, loss, sums = mini_batch_grads(params, frozen, mini_batch)
        grad_norm = optax.global_norm(grads)
        role_norms = ()
        if planner_grads is not None:
            planner = planner_grads(params, frozen, mini_batch)[0]
            role_norms = (optax.global_norm(planner),
                          optax.global_norm(jax.tree.map(jnp.subtract, grads, planner)))
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        # A non-finite loss or gradient, or an update that makes a parameter non-finite (an
        # infinite lr, an overflow), leaves params AND optimizer moments untouched: non-finite
        # numbers never enter the state, so they never reach a checkpoint.
        finite = jnp.isfinite(grad_norm) & jnp.isfinite(loss) & tree_all_finite(new_params)
        params = _tree_where(finite, new_params, params)
        opt_state = _tree_where(finite, new_opt_state, opt_state)
        skipped = skipped + (~finite).astype(jnp.int32)
        return (params, opt_state, frozen, skipped), (loss, sums, grad_norm, role_norms)

    def step(state: TrainState, batch: PackedBatch):
        batches = _split_rows(batch, mini, micro, mesh)
        carry = (state.params, state.opt_state, state.frozen, jnp.zeros((), jnp.int32))
        per_step = []
        for _ in range(epochs):  # epochs are few; unrolled keeps the scan body simple
            carry, outputs = jax.lax.scan(optimizer_step, carry, batches)
            per_step.append(outputs)
        params, opt_state, frozen, skipped = carry
        losses, sums, grad_norms, role_norms = jax.tree.map(lambda *xs: jnp.stack(xs),
                                                            *per_step)
        # losses: [epochs, mini]; the whole-batch objective of an epoch is its sum over minis.
        metric_sums = jax.tree.map(lambda x: x.sum() / epochs, sums)
        metrics = loss_lib.finalize_metrics(metric_sums)
        applied = mini * epochs - skipped
        new_state = state.replace(
            params=params, opt_state=opt_state, step=state.step + 1,
            optimizer_steps=state.optimizer_steps + applied,
            skipped_steps=state.skipped_steps + skipped,
            nonfinite_streak=jnp.where(skipped > 0, state.nonfinite_streak + 1, 0),
            rng=jax.random.key_data(jax.random.split(jax.random.wrap_key_data(state.rng))[0]))
        metrics.update({
            "loss": losses.sum(axis=-1).mean(),
            "first_epoch_loss": losses[0].sum(),
            "grad_norm": grad_norms.mean(),
            **{f"{role}/grad_norm": norms.mean()
               for role, norms in zip(loss_lib.ROLE_NAMES, role_norms)},
            "skipped_updates": skipped,
            "skipped_updates_total": new_state.skipped_steps,
            "nonfinite_streak": new_state.nonfinite_streak,
            "optimizer_steps": new_state.optimizer_steps,
        })
        if lr_schedule is not None:
            # The lr of the last update this call applied (or would have applied).
            metrics["learning_rate"] = lr_schedule(jnp.maximum(new_state.optimizer_steps - 1, 0))
        return new_state, metrics

    batch_sharding = parallel.batch_sharding(mesh)
    jitted = jax.jit(_on_mesh(step, mesh), in_shardings=(shardings, batch_sharding),
                     out_shardings=(shardings, None), donate_argnums=0)
    multiple = config.row_multiple(mesh)

    def run(state: TrainState, batch: PackedBatch):
        rows = batch.tokens.shape[0]
        if rows % multiple:
            raise ValueError(f"batch has {rows} rows, not a multiple of micro_batches x "
                             f"ppo_mini_batches x data-parallel devices = {multiple}")
        if config.objective == "rl" and config.loss.kl_coef > 0 and batch.ref_logprobs is None:
            raise ValueError("LossConfig.kl_coef > 0 but the batch has no ref_logprobs")
        if (config.objective == "rl" and config.loss.rollout_correction != "off"
                and batch.recomputed_logprobs is None):
            raise ValueError(f"LossConfig.rollout_correction="
                             f"{config.loss.rollout_correction!r} but the batch has no "
                             "recomputed_logprobs")
        return jitted(state, jax.device_put(batch, batch_sharding))

    run.jitted = jitted
    return run
