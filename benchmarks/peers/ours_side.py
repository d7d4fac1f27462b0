"""Our side of the comparison: matpo_jax's Qwen3 loaded from the shared HF directory by
`load_pretrained`, and the slot sampler's `generate` (one jitted loop, no stop ids, so every row
runs to the full length as tunix's rows do with an EOS that cannot be sampled)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from matpo_jax.model import CausalLM, load_pretrained
from matpo_jax.sampler.loop import Sampling, generate as slot_generate

GREEDY = Sampling(greedy=True)


def load(path: str) -> CausalLM:
    return load_pretrained(path)


class Generator:
    """generate() over fixed shapes: max_len is the same cache length tunix gets."""

    def __init__(self, model: CausalLM, max_len: int):
        self.graphdef, self.state = nnx.split(model)
        self.max_len = max_len

    def __call__(self, prompts: np.ndarray, new_tokens: int, sampling: Sampling = GREEDY,
                 rng=None):
        tokens, logprobs = slot_generate(self.state, self.graphdef, [r.tolist() for r in prompts],
                                         new_tokens, sampling, stop_ids=(), rng=rng,
                                         slots=len(prompts), max_len=self.max_len)
        tokens = np.stack(tokens)
        assert tokens.shape == (len(prompts), new_tokens), tokens.shape
        return tokens, np.stack(logprobs)


def forward_logits(model: CausalLM, tokens: np.ndarray) -> np.ndarray:
    """Cache-free causal forward [B, T] -> logits [B, T, V] (the training path)."""
    return np.asarray(jax.jit(lambda t: model(t))(jnp.asarray(tokens)))
