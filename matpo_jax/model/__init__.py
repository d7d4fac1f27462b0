"""Qwen3 decoder, its KV cache, and Hugging Face checkpoint interop."""
from matpo_jax.model.config import ModelConfigError, Qwen3Config
from matpo_jax.model.hf_io import CheckpointFormatError, load_pretrained, save_pretrained
from matpo_jax.model.qwen3 import KVCache, Qwen3ForCausalLM, init_cache

__all__ = [
    "CheckpointFormatError",
    "KVCache",
    "ModelConfigError",
    "Qwen3Config",
    "Qwen3ForCausalLM",
    "init_cache",
    "load_pretrained",
    "save_pretrained",
]
