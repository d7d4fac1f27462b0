"""Qwen3 model configuration and its translation to and from Hugging Face `config.json`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

SUPPORTED_DTYPES = ("float32", "bfloat16")

# Fields a Hugging Face Qwen3 config.json must carry for us to build the model.
_REQUIRED_HF_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


class ModelConfigError(ValueError):
    """A configuration we cannot build a Qwen3 model from; the message names the field."""


@dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960
    dtype: str = "float32"  # compute dtype of activations
    param_dtype: str = "float32"  # storage dtype of parameters
    initializer_range: float = 0.02

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ModelConfigError(
                f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in SUPPORTED_DTYPES:
                raise ModelConfigError(
                    f"{name} must be one of {SUPPORTED_DTYPES}, got {getattr(self, name)!r}")

    @property
    def num_query_groups(self) -> int:
        """Query heads that share one key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    def replace(self, **changes) -> "Qwen3Config":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], **overrides) -> "Qwen3Config":
        """A config from a HF Qwen3 `config.json` dict; rejects features we don't implement."""
        _check_hf_architecture(d)
        for name in _REQUIRED_HF_FIELDS:
            if name not in d:
                raise ModelConfigError(f"config is missing required field '{name}'")
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        fields = dict(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rope_theta=float(_rope_theta(d)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=int(d.get("max_position_embeddings", 40960)),
            initializer_range=float(d.get("initializer_range", 0.02)),
        )
        fields.update(overrides)
        return cls(**fields)

    def to_hf_dict(self) -> dict[str, Any]:
        """The `config.json` contents that transformers' Qwen3ForCausalLM loads."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            # Both spellings: transformers 5 reads rope_parameters, older releases rope_theta.
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rope_scaling": None,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "dtype": self.param_dtype,
        }


def _check_hf_architecture(d: Mapping[str, Any]) -> None:
    model_type = d.get("model_type")
    if model_type != "qwen3":
        raise ModelConfigError(f"model_type must be 'qwen3', got {model_type!r}")
    architectures = d.get("architectures")
    if architectures and not any(a in ("Qwen3ForCausalLM", "Qwen3Model") for a in architectures):
        raise ModelConfigError(
            f"architectures must include 'Qwen3ForCausalLM', got {architectures!r}")
    if d.get("hidden_act", "silu") != "silu":
        raise ModelConfigError(f"hidden_act must be 'silu', got {d['hidden_act']!r}")
    if d.get("attention_bias", False):
        raise ModelConfigError(
            "attention_bias=True is not supported (Qwen3 attention has no biases)")
    if d.get("mlp_bias", False):
        raise ModelConfigError("mlp_bias=True is not supported")
    if d.get("use_sliding_window", False):
        raise ModelConfigError("use_sliding_window=True is not supported (full attention only)")
    layer_types = d.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise ModelConfigError(
            f"layer_types must all be 'full_attention', got {sorted(set(layer_types))}")
    for field in ("rope_scaling", "rope_parameters"):
        rope = d.get(field)
        if rope:
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type != "default":
                raise ModelConfigError(
                    f"{field} type {rope_type!r} is not supported (only 'default')")


def _rope_theta(d: Mapping[str, Any]) -> float:
    rope = d.get("rope_parameters") or {}
    if "rope_theta" in rope:
        return rope["rope_theta"]
    return d.get("rope_theta", 1e6)
