"""The decoder (Qwen3, Llama, Qwen2 families), its KV cache, and Hugging Face checkpoint interop."""
from matpo_jax.model.config import ModelConfigError, DecoderConfig
from matpo_jax.model.hf_io import CheckpointFormatError, load_pretrained, save_pretrained
from matpo_jax.model.decoder import KVCache, CausalLM, init_cache

__all__ = [
    "CheckpointFormatError",
    "KVCache",
    "ModelConfigError",
    "DecoderConfig",
    "CausalLM",
    "init_cache",
    "load_pretrained",
    "save_pretrained",
]
