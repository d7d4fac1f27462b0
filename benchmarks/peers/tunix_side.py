"""tunix's side of the comparison: its Qwen3 loaded from the shared HF directory by its own
safetensors loader, and its `Sampler` driven the way its documentation drives it.

tunix's Sampler takes strings and a tokenizer. The benchmark has token ids, so `IdTokenizer`
spells ids as space-separated numbers: encode/decode are exact and cost microseconds. Its pad id
is -1, an id no prompt or model output can hold: tunix treats every buffer position equal to the
pad id as padding (masked out of attention), so a real pad id would silently change what the
model sees whenever greedy decoding produced it. Prompts of a power-of-two length are not padded
(tunix rounds the prompt length up to the next power of two).
"""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
from tunix.generate import sampler as tunix_sampler
from tunix.models.qwen3 import model as tunix_qwen3
from tunix.models.qwen3 import params as tunix_params

NEVER = -2  # an EOS id that cannot be sampled: every row runs to the full length, as on our side


class IdTokenizer:
    """The tokenizer protocol tunix's TokenizerAdapter accepts (encode/decode/bos/eos/pad)."""

    def encode(self, text: str, **_) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **_) -> str:
        return " ".join(str(int(t)) for t in ids)

    def bos_id(self):
        return None  # no BOS prepended: the prompts are the ids as given

    def eos_id(self) -> int:
        return NEVER

    def pad_id(self) -> int:
        return -1


def config_from_hf(path: str) -> tunix_qwen3.ModelConfig:
    """tunix's ModelConfig for the HF config.json at `path` (float32, no sharding)."""
    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    return tunix_qwen3.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"],
        num_heads=hf["num_attention_heads"], head_dim=hf["head_dim"],
        num_kv_heads=hf["num_key_value_heads"], rope_theta=hf["rope_theta"],
        norm_eps=hf["rms_norm_eps"], use_tied_embedding=hf.get("tie_word_embeddings", False))


def load(path: str) -> tunix_qwen3.Qwen3:
    return tunix_params.create_model_from_safe_tensors(path, config_from_hf(path))


def as_text(rows: np.ndarray) -> list[str]:
    return [" ".join(map(str, row.tolist())) for row in rows]


def make_sampler(model: tunix_qwen3.Qwen3, cache_size: int) -> tunix_sampler.Sampler:
    config = model.config
    return tunix_sampler.Sampler(model, IdTokenizer(), tunix_sampler.CacheConfig(
        cache_size=cache_size, num_layers=config.num_layers, num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim))


def generate(sampler: tunix_sampler.Sampler, prompts: np.ndarray, new_tokens: int,
             logprobs: bool = False, **sampling):
    """Greedy by default (tunix: no top_p given); sampling kwargs (temperature, top_p, top_k,
    seed) switch to its top-p mode. Returns (tokens [B, new_tokens], logprobs or None)."""
    out = sampler(as_text(prompts), max_generation_steps=new_tokens,
                  max_prompt_length=prompts.shape[1], eos_tokens=[NEVER],
                  return_logprobs=logprobs, **sampling)
    tokens = np.stack([np.asarray(t) for t in out.tokens])
    assert tokens.shape == (len(prompts), new_tokens), tokens.shape
    return tokens, (np.asarray(out.logprobs, np.float32) if logprobs else None)


def forward_logits(model: tunix_qwen3.Qwen3, tokens: np.ndarray) -> np.ndarray:
    """Cache-free causal forward [B, T] -> logits [B, T, V], tunix's training-path call."""
    batch, length = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)), (batch, length, length))
    logits, _ = model(jnp.asarray(tokens), positions, None, mask)
    return np.asarray(logits)
