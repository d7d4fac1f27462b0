"""The MATPO objective: per-token clipped surrogate, batch-exact aggregation, KL, entropy, metrics.

Exactness under micro-batching and data parallelism: every aggregation mode is expressed as a
per-token weight computed on the host over the WHOLE RL batch (`aggregation_weights`), so the loss
is a plain weighted sum `sum(w * l)`. Summing that over any split of rows gives the same number, and
so do its gradients. Metrics are carried as (sum, count) pairs and divided once at the end.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from matpo_jax.trainer import logprobs as logprobs_lib
from matpo_jax.trainer import setwise

AGGREGATION_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                     "seq-mean-token-sum-norm", "matpo")
SEQ_DENOMINATORS = ("sequences", "planners")
RATIOS = ("token", "setwise")  # docs/METHOD.md sections 5 and 5.1
KL_TYPES = ("k1", "low_var_kl")
# docs/METHOD.md 5.2: off; measure (the step recomputes the sampled tokens' log-probs and logs how
# far the sampler's are from them); tis (also: PPO's ratio against the recomputed log-probs, and
# each token's loss weighted by min(pi_step / pi_sampler, tis_cap), truncated importance sampling).
ROLLOUT_CORRECTIONS = ("off", "measure", "tis")
ROLE_NAMES = ("planner", "worker")  # index = role id (trajectory.ROLE_IDS)
LOG_RATIO_LIMIT = 20.0  # clip log(rho) before exp so a stale token cannot overflow


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The objective's settings. The knobs are the `rl` config fields of the same names (built
    by run.runtime.loss_config); their defaults are declared there only, so here they have none."""

    loss_agg: str  # one of AGGREGATION_MODES
    # seq-mean modes divide by the number of non-empty sequences (veRL) or, as the reference MATPO
    # release does, by the number of planner rollouts.
    seq_mean_denominator: str
    loss_agg_norm: float  # seq-mean-token-sum-norm's divisor; 0 -> the padded row length
    eps_low: float
    eps_high: float
    dual_clip_c: float
    kl_coef: float  # > 0 needs batch.ref_logprobs
    kl_type: str
    entropy_coef: float
    # token: one ratio per token (PPO); setwise (SRPO): one ratio per set of a planner turn and
    # the workers it spawned, exp(sum of its tokens' log-ratios / sqrt(K)) (trainer/setwise.py).
    ratio: str
    rollout_correction: str  # one of ROLLOUT_CORRECTIONS
    tis_cap: float  # tis: the largest importance weight pi_step / pi_sampler a token gets
    entropy_metrics: bool = True  # costs one more pass over the vocabulary
    # Internal, setwise: rows are dealt to micro-batches by row % set_row_stride (the train
    # step's mini x micro batches), so a set's rows lie set_row_stride apart per micro-batch row.
    set_row_stride: int = 1
    # Internal (the train step's per-role gradient norms): only this role's tokens enter the
    # weighted sum; the ratios and metrics are computed as without it. None: every token.
    weight_role: int | None = None

    def __post_init__(self):
        for field, allowed in (("loss_agg", AGGREGATION_MODES),
                               ("seq_mean_denominator", SEQ_DENOMINATORS),
                               ("kl_type", KL_TYPES), ("ratio", RATIOS),
                               ("rollout_correction", ROLLOUT_CORRECTIONS)):
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"LossConfig.{field}={value!r}, expected one of {allowed}")
        if not self.tis_cap >= 1.0:
            raise ValueError(f"LossConfig.tis_cap={self.tis_cap!r} must be >= 1 (a cap below 1 "
                             "would down-weight every token)")


# ----------------------------------------------------------------------------- host: weights

@dataclasses.dataclass(frozen=True)
class WeightTotals:
    """The batch-wide normalisers of the aggregation modes: loss tokens (token-mean), groups
    (matpo), non-empty sequences and planner rollouts (seq-mean modes). A multi-process batch
    sums every process's totals (`weight_totals`) so each process's weights are those of the
    whole batch; a group's own token count stays local (a group never spans processes)."""

    tokens: float
    groups: int
    sequences: int
    planners: int

    @classmethod
    def sum(cls, rows: Sequence[Sequence[float]]) -> "WeightTotals":
        """The totals of several parts, from their `as_row()`s."""
        tokens, groups, sequences, planners = np.asarray(rows, np.float64).sum(axis=0)
        return cls(float(tokens), int(round(groups)), int(round(sequences)), int(round(planners)))

    def as_row(self) -> np.ndarray:
        return np.array([self.tokens, self.groups, self.sequences, self.planners], np.float64)


def weight_totals(masks: Sequence[np.ndarray], group_ids: Sequence[int],
                  role_ids: Sequence[int]) -> WeightTotals:
    """The normalisers `aggregation_weights` computes from these sequences alone."""
    counts = np.array([np.asarray(m, np.float64).sum() for m in masks])
    return WeightTotals(tokens=float(counts.sum()), groups=len(set(group_ids)),
                        sequences=int((counts > 0).sum()),
                        planners=sum(1 for r in role_ids if r == 0))


def aggregation_weights(masks: Sequence[np.ndarray], group_ids: Sequence[int],
                        role_ids: Sequence[int], mode: str, *, seq_denominator: str = "sequences",
                        norm_constant: float | None = None,
                        totals: WeightTotals | None = None) -> list[np.ndarray]:
    """Per-token weights, one float32 array per sequence, such that the batch loss is
    sum_seq sum_t w[t] * l[t].

    masks[s]: the sequence's loss mask; group_ids[s]: the planner rollout it belongs to (itself
    for a planner); role_ids[s]: 0 planner/single, 1 worker. totals: the whole batch's
    normalisers when these sequences are one process's part of it (default: their own).
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"aggregation mode {mode!r}, expected one of {AGGREGATION_MODES}")
    if seq_denominator not in SEQ_DENOMINATORS:
        raise ValueError(f"seq_denominator {seq_denominator!r}, expected one of {SEQ_DENOMINATORS}")
    masks = [np.asarray(m, dtype=np.float64) for m in masks]
    counts = np.array([m.sum() for m in masks])
    totals = totals or weight_totals(masks, group_ids, role_ids)

    def per_sequence(scale):  # mask times one factor per sequence
        return [(m * s).astype(np.float32) for m, s in zip(masks, scale)]

    if mode == "token-mean":
        total = totals.tokens
        return per_sequence(np.full(len(masks), 1.0 / total if total else 0.0))
    if mode == "seq-mean-token-sum-norm":
        if norm_constant is None:
            raise ValueError("seq-mean-token-sum-norm needs norm_constant (the padded length)")
        return per_sequence(np.full(len(masks), 1.0 / norm_constant))
    if mode == "matpo":  # (1/G) sum_i (1/N_i) sum over tokens of planner i and its workers
        group_tokens: dict[int, float] = {}
        for g, c in zip(group_ids, counts):
            group_tokens[g] = group_tokens.get(g, 0.0) + c
        num_groups = totals.groups
        return per_sequence([1.0 / (num_groups * group_tokens[g]) if group_tokens[g] else 0.0
                             for g in group_ids])
    num_sequences = totals.sequences if seq_denominator == "sequences" else totals.planners
    if num_sequences == 0:
        return per_sequence(np.zeros(len(masks)))
    if mode == "seq-mean-token-sum":
        return per_sequence(np.full(len(masks), 1.0 / num_sequences))
    # seq-mean-token-mean
    return per_sequence([1.0 / (num_sequences * c) if c else 0.0 for c in counts])


# ----------------------------------------------------------------------------- device: per token

def token_logprobs(logits: jax.Array, tokens: jax.Array, segment_ids: jax.Array,
                   with_entropy: bool = False, temperature: float = 1.0):
    """log p(tokens[t] | prefix) from logits[t-1] (next-token prediction), shape [B, T], under
    softmax(logits / temperature) (the sampler's distribution: see `sampler.ops.sample_tokens`).

    Position t is predictable only when t-1 lies in the same (non-padding) segment, so a packed
    segment's first token is never scored from the previous segment's last logits; those
    positions get log-prob 0 (and the packer never puts loss on them). Also returns the entropy of
    the predicting distribution (zeros when with_entropy=False) and the predictable mask.

    This is the dense reference (it takes materialised [B, T, V] logits); the train step uses
    `logprobs.next_token_logprobs`, the same numbers computed blockwise from hidden states.
    """
    logits = logits.astype(jnp.float32)
    if not isinstance(temperature, (int, float)):  # one per position ([B, T]: role_temperatures)
        logits = logits / temperature[..., None]
    elif temperature != 1.0:
        logits = logits / temperature
    prev_logits = logits[:, :-1]
    log_norm = jax.nn.logsumexp(prev_logits, axis=-1)
    target_logit = jnp.take_along_axis(prev_logits, tokens[:, 1:, None], axis=-1)[..., 0]
    logp = target_logit - log_norm
    if with_entropy:
        probs = jax.nn.softmax(prev_logits, axis=-1)
        entropy = log_norm - jnp.sum(probs * prev_logits, axis=-1)
    else:
        entropy = jnp.zeros_like(logp)
    predictable = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0)
    pad = ((0, 0), (1, 0))
    return (jnp.pad(jnp.where(predictable, logp, 0.0), pad),
            jnp.pad(jnp.where(predictable, entropy, 0.0), pad),
            jnp.pad(predictable, pad))


def clipped_surrogate(logp, old_logp, advantages, eps_low: float, eps_high: float,
                      dual_clip: float | None):
    """Per-token PPO loss with dual clip; returns (loss, clipped indicator)."""
    rho = jnp.exp(jnp.clip(logp - old_logp, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    unclipped = -advantages * rho
    clipped = -advantages * jnp.clip(rho, 1.0 - eps_low, 1.0 + eps_high)
    loss = jnp.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    if dual_clip is not None:
        # For A < 0 a huge rho would make the loss unbounded; cap it at -A*c.
        capped = jnp.minimum(loss, -advantages * dual_clip)
        is_clipped = is_clipped | ((advantages < 0) & (capped < loss))
        loss = jnp.where(advantages < 0, capped, loss)
    return loss, is_clipped


def kl_penalty(logp, ref_logp, kind: str):
    """Per-token KL estimate to a frozen reference policy."""
    if kind == "k1":
        return logp - ref_logp
    log_ratio = jnp.clip(ref_logp - logp, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)  # k3, low variance


# ----------------------------------------------------------------------------- objectives

def _role_sums(role_ids, mask, named_values: dict) -> dict:
    """Per-role sums of per-token values over the loss mask, plus the role's token count."""
    sums = {}
    for role_id, role in enumerate(ROLE_NAMES):
        role_mask = mask * (role_ids == role_id)
        sums[f"{role}/tokens"] = jnp.sum(role_mask)
        for name, value in named_values.items():
            sums[f"{role}/{name}"] = jnp.sum(role_mask * value)
    return sums


def needs_entropy(config: LossConfig) -> bool:
    return config.entropy_coef > 0 or config.entropy_metrics


def policy_objective(logp, entropy, batch, config: LossConfig):
    """RL objective of one (micro-)batch from its per-token log-probs [B, T] (and the entropy of
    the predicting distributions, used when entropy_coef > 0 or entropy_metrics):
    (weighted loss sum, per-role metric sums)."""
    if config.entropy_coef == 0:
        entropy = jax.lax.stop_gradient(entropy)
    mask = batch.loss_mask.astype(jnp.float32)
    old_logp, tis_weight = behaviour_logprobs(batch, config)
    if config.ratio == "setwise":
        # One ratio per set, the same on each member token: rho = exp(set log-ratio).
        set_log_ratio = setwise.set_log_ratios(logp - old_logp, mask, batch,
                                               config.set_row_stride)
        pg, is_clipped = clipped_surrogate(set_log_ratio, 0.0, batch.advantages,
                                           config.eps_low, config.eps_high, config.dual_clip_c)
    else:
        pg, is_clipped = clipped_surrogate(logp, old_logp, batch.advantages,
                                           config.eps_low, config.eps_high, config.dual_clip_c)
    values = {}
    if tis_weight is not None:
        pg = tis_weight * pg
        values["tis_weight"] = tis_weight
        values["tis_capped_frac"] = (tis_weight >= config.tis_cap).astype(jnp.float32)
    per_token = pg
    values.update({"pg_loss": pg, "clip_frac": is_clipped.astype(jnp.float32),
                   "advantage": batch.advantages})
    if config.kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("LossConfig.kl_coef > 0 needs batch.ref_logprobs")
        kl = kl_penalty(logp, batch.ref_logprobs, config.kl_type)
        per_token = per_token + config.kl_coef * kl
        values["ref_kl"] = kl
    if config.entropy_coef > 0:
        per_token = per_token - config.entropy_coef * entropy
    if needs_entropy(config):
        values["entropy"] = entropy
    log_ratio = jax.lax.stop_gradient(logp - old_logp)
    values["approx_kl"] = jnp.exp(log_ratio) - 1.0 - log_ratio  # k3 of KL(old || current)
    weights = batch.loss_weights
    if config.weight_role is not None:
        weights = weights * (batch.role_ids == config.weight_role)
    loss = jnp.sum(weights * mask * per_token)
    metrics = _role_sums(batch.role_ids, mask, {k: jax.lax.stop_gradient(v)
                                                for k, v in values.items()})
    return loss, metrics


def behaviour_logprobs(batch, config: LossConfig):
    """(PPO's old log-probs, the truncated importance weight or None) of every token.

    off / measure: the sampler's recorded log-probs are the old policy, as in the paper. tis: the
    step's own log-probs at the sampling parameters are (so the ratio starts at exactly 1), and
    the sampler/step gap becomes a per-token weight min(pi_step / pi_sampler, tis_cap), constant
    in the gradient (METHOD 5.2)."""
    if config.rollout_correction == "off":
        return batch.old_logprobs, None
    if batch.recomputed_logprobs is None:
        raise ValueError(f"LossConfig.rollout_correction={config.rollout_correction!r} needs "
                         "batch.recomputed_logprobs (the step's log-probs at the sampling "
                         "parameters)")
    if config.rollout_correction == "measure":
        return batch.old_logprobs, None
    gap = jnp.clip(batch.recomputed_logprobs - batch.old_logprobs,
                   -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    weight = jax.lax.stop_gradient(jnp.minimum(jnp.exp(gap), config.tis_cap))
    return batch.recomputed_logprobs, weight


def rollout_mismatch(sampler_logp, step_logp, mask) -> dict:
    """How far the sampler's log-probs of the trained tokens are from the step's own at the same
    parameters: mean and max of |difference|, and k3's estimate of KL(sampler || step) (tokens
    are the sampler's draws: mean of exp(r) - 1 - r, r = step - sampler). Traceable: the sums
    are global over a sharded batch."""
    mask = mask.astype(jnp.float32)
    diff = jnp.clip(step_logp - sampler_logp, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    tokens = jnp.maximum(mask.sum(), 1.0)
    return {"mismatch/abs_mean": jnp.sum(mask * jnp.abs(diff)) / tokens,
            "mismatch/abs_max": jnp.max(mask * jnp.abs(diff)),
            "mismatch/kl": jnp.sum(mask * (jnp.exp(diff) - 1.0 - diff)) / tokens,
            "mismatch/tokens": mask.sum()}


def sft_objective(logp, batch):
    """Supervised objective from per-token log-probs: cross-entropy on trainable tokens, weighted
    like the RL loss."""
    mask = batch.loss_mask.astype(jnp.float32)
    loss = jnp.sum(batch.loss_weights * mask * -logp)
    metrics = _role_sums(batch.role_ids, mask, {"nll": jax.lax.stop_gradient(-logp)})
    return loss, metrics


def role_temperatures(role_ids, temperature: float, worker_temperature: float | None):
    """The log-prob temperature of every position: `temperature`, or with a worker temperature of
    its own, [B, T] with `worker_temperature` on worker rows (a position predicts the next token
    of its own sequence, whose role it shares; the predictions across segments are masked)."""
    if worker_temperature is None or worker_temperature == temperature:
        return temperature
    return jnp.where(role_ids == 1, jnp.float32(worker_temperature), jnp.float32(temperature))


def policy_loss(logits, batch, config: LossConfig, temperature: float = 1.0):
    """RL objective of one (micro-)batch from dense logits [B, T, V], log-probs taken at the
    rollout's sampling `temperature`: (weighted loss sum, per-role metric sums)."""
    logp, entropy, _ = token_logprobs(logits, batch.tokens, batch.segment_ids,
                                      needs_entropy(config), temperature)
    return policy_objective(logp, entropy, batch, config)


def sft_loss(logits, batch, config: LossConfig | None = None):
    """Supervised objective from dense logits: cross-entropy on trainable tokens."""
    logp, _, _ = token_logprobs(logits, batch.tokens, batch.segment_ids)
    return sft_objective(logp, batch)


def scored_capacity(row_length: int) -> int:
    """Positions a row sends through the output head in the train step: a quarter of the row
    (a multiple of 128). Rows scoring more make that micro-batch take the whole-row path
    (`logprobs.scored_next_token_logprobs`), so this sets the cost, never the values."""
    return min(row_length, -(-row_length // (4 * 128)) * 128)


def model_objective(model, batch, config: LossConfig, *, objective: str = "rl",
                    temperature: float = 1.0, worker_temperature: float | None = None,
                    remat: str = "none", scan_layers: bool = False,
                    seq_block: int = logprobs_lib.SEQ_BLOCK,
                    vocab_block: int = logprobs_lib.VOCAB_BLOCK):
    """The objective straight from the model, as the train step differentiates it: decoder
    layers (rematerialised per `remat`, optionally as one scan), then log-probs blockwise from the hidden states (the
    [B, T, V] logits never exist). RL log-probs at the rollout's sampling `temperature`; SFT at 1.
    """
    rl = objective == "rl"
    # Both objectives read log-probs (and entropies) at loss-mask positions only.
    logp, entropy, _ = logprobs_lib.score_tokens(
        model, batch.tokens, batch.positions, batch.segment_ids,
        temperature=role_temperatures(batch.role_ids, temperature, worker_temperature) if rl
        else 1.0, with_entropy=rl and needs_entropy(config),
        entropy_gradient=rl and config.entropy_coef > 0, remat=remat, scan_layers=scan_layers,
        seq_block=seq_block, vocab_block=vocab_block, scored=batch.loss_mask != 0,
        scored_capacity=scored_capacity(batch.tokens.shape[1]),
        prefix_ids=batch.prefix_ids, roles=batch.role_ids)  # roles: each token's LoRA adapter
    return policy_objective(logp, entropy, batch, config) if rl else sft_objective(logp, batch)


def finalize_metrics(sums: dict) -> dict:
    """Turns accumulated per-role sums into means; token counts stay counts."""
    out = {}
    for key, value in sums.items():
        role, name = key.split("/", 1)
        if name == "tokens":
            out[key] = value
        else:
            out[key] = value / jnp.maximum(sums[f"{role}/tokens"], 1.0)
    return out
