"""Per-chip bytes of sharded arrays and the model FLOPs of a Qwen3 train step, by formula.

XLA's own FLOP count (`Compiled.cost_analysis()`) sees each loop body once (the flash-attention
and log-softmax loops, the micro-batch scan, a scanned layer stack), so the step's FLOPs are
counted here from the model's shapes instead; both are reported.
"""
from __future__ import annotations

import math

import jax
import numpy as np

from matpo_jax.model.config import DecoderConfig


def per_chip_bytes(tree) -> int:
    """Bytes one device holds of a tree of arrays or ShapeDtypeStructs with NamedShardings (the
    largest shard, i.e. the device with the most of it; shards are even here)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.shape else ()
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return int(total)


def total_bytes(tree) -> int:
    return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def forward_flops_per_token(config: DecoderConfig, context: float) -> dict:
    """Multiply-adds x 2 of one token's forward: the layers' matmuls, attention over `context`
    keys on average, and the output head."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    matmuls = 2 * (h * (q + 2 * kv) + q * h + 3 * h * i) * layers
    attention = 2 * 2 * q * context * layers  # scores and the weighted sum of values
    head = 2 * h * config.vocab_size
    return {"layers": matmuls + attention, "head": head, "attention": attention}


def train_step_flops(config: DecoderConfig, tokens: int, row_length: int, remat: str) -> dict:
    """Model FLOPs of one train step over `tokens` positions in rows of `row_length` (causal
    attention over a whole row: the most a packed row can cost) and the hardware FLOPs with the
    recomputation: the backward costs twice the forward; remat "full" reruns the layers' forward,
    and the blockwise log-softmax always recomputes the head's logits in its backward."""
    per_token = forward_flops_per_token(config, (row_length + 1) / 2)
    forward = per_token["layers"] + per_token["head"]
    model = 3 * forward * tokens
    recompute = per_token["head"] + (per_token["layers"] if remat == "full" else 0)
    return {"model_flops": float(model), "hardware_flops": float(model + recompute * tokens),
            "attention_share": per_token["attention"] / forward}
