"""Decoder configuration for the model families we build (Qwen3, Llama, Qwen2), and its
translation to and from Hugging Face `config.json`.

The three families are one architecture with switches: Qwen3 RMS-normalises each query and key
head before the rotation, Qwen2 adds biases to the q/k/v projections, Llama has neither (and
Llama 3.x rescales its rotary frequencies). Everything else (pre-norm residual blocks, grouped-
query attention, SwiGLU MLP, tied or untied head) is shared.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

SUPPORTED_DTYPES = ("float32", "bfloat16")

# family -> (model_type in config.json, the architecture class transformers builds).
FAMILIES = {
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
}
ROPE_TYPES = ("default", "linear", "llama3")

# The attention implementations each path offers (model/attention_dispatch.py; config field
# model.attention.<path>). "auto" picks by backend: the CPU runs "xla", the plain-jnp reference.
ATTENTION_KERNELS = {
    "train": ("auto", "xla", "splash", "cudnn", "pallas_gpu"),  # packed training rows
    # multi-token extend / prefill over the KV cache; "paged_tpu" needs a paged cache
    "extend": ("auto", "xla", "paged_tpu"),
    # one-token decode steps over the KV cache; "paged_*" need a paged cache (paged_cache.py)
    "decode": ("auto", "xla", "paged_tpu", "paged_gpu"),
}

# Fields a Hugging Face config.json must carry for us to build the model.
_REQUIRED_HF_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


class ModelConfigError(ValueError):
    """A configuration we cannot build a decoder from; the message names the field."""


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    family: str = "qwen3"
    rope_theta: float = 1e6
    # Rotary frequency scaling: 'linear' divides every frequency by rope_factor; 'llama3' divides
    # only the low frequencies, blending in between (Llama 3.1+'s long-context recipe).
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960
    dtype: str = "float32"  # compute dtype of activations
    param_dtype: str = "float32"  # storage dtype of parameters
    initializer_range: float = 0.02
    # Attention implementation per path (ATTENTION_KERNELS): compute settings like `dtype`,
    # never written to config.json.
    attention_train: str = "auto"
    attention_extend: str = "auto"
    attention_decode: str = "auto"

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.family not in FAMILIES:
            raise ModelConfigError(
                f"family must be one of {tuple(FAMILIES)}, got {self.family!r}")
        if self.rope_type not in ROPE_TYPES:
            raise ModelConfigError(
                f"rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}")
        if self.rope_type == "llama3" and not self.rope_high_freq_factor > self.rope_low_freq_factor:
            raise ModelConfigError(
                f"rope_high_freq_factor ({self.rope_high_freq_factor}) must exceed "
                f"rope_low_freq_factor ({self.rope_low_freq_factor})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ModelConfigError(
                f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        for path, choices in ATTENTION_KERNELS.items():
            if getattr(self, f"attention_{path}") not in choices:
                raise ModelConfigError(f"attention_{path} must be one of {choices}, got "
                                       f"{getattr(self, f'attention_{path}')!r}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in SUPPORTED_DTYPES:
                raise ModelConfigError(
                    f"{name} must be one of {SUPPORTED_DTYPES}, got {getattr(self, name)!r}")

    @property
    def num_query_groups(self) -> int:
        """Query heads that share one key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def qk_norm(self) -> bool:
        """Each query and key head is RMS-normalised before the rotation (Qwen3)."""
        return self.family == "qwen3"

    @property
    def qkv_bias(self) -> bool:
        """The q/k/v projections carry biases (Qwen2; o_proj has none)."""
        return self.family == "qwen2"

    def replace(self, **changes) -> "DecoderConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], **overrides) -> "DecoderConfig":
        """A config from a HF `config.json` dict; rejects features we don't implement."""
        family = _family(d)
        _check_hf_features(d, family)
        for name in _REQUIRED_HF_FIELDS:
            if name not in d:
                raise ModelConfigError(f"config is missing required field '{name}'")
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        fields = dict(
            family=family,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=int(d.get("max_position_embeddings", 40960)),
            initializer_range=float(d.get("initializer_range", 0.02)),
            **_rope_fields(d),
        )
        fields.update(overrides)
        return cls(**fields)

    def to_hf_dict(self) -> dict[str, Any]:
        """The `config.json` contents that transformers loads as this family's CausalLM."""
        model_type, architecture = FAMILIES[self.family]
        hf = {
            "architectures": [architecture],
            "model_type": model_type,
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
            # Both spellings: transformers 5 reads rope_parameters, older releases rope_theta
            # and rope_scaling.
            "rope_theta": self.rope_theta,
            "rope_parameters": self._hf_rope_parameters(),
            "rope_scaling": (None if self.rope_type == "default"
                             else self._hf_rope_parameters()),
            "attention_dropout": 0.0,
            "dtype": self.param_dtype,
        }
        if self.family == "llama":
            hf.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
        else:  # Qwen3 and Qwen2 declare their (full) attention layers
            hf.update(use_sliding_window=False, sliding_window=None,
                      layer_types=["full_attention"] * self.num_hidden_layers)
        if self.family == "qwen3":
            hf["attention_bias"] = False
        return hf

    def _hf_rope_parameters(self) -> dict[str, Any]:
        rope = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        if self.rope_type in ("linear", "llama3"):
            rope["factor"] = self.rope_factor
        if self.rope_type == "llama3":
            rope.update(low_freq_factor=self.rope_low_freq_factor,
                        high_freq_factor=self.rope_high_freq_factor,
                        original_max_position_embeddings=self.rope_original_max_positions)
        return rope


def _family(d: Mapping[str, Any]) -> str:
    model_type = d.get("model_type")
    families = {model_type: family for family, (model_type, _) in FAMILIES.items()}
    if model_type not in families:
        raise ModelConfigError(
            f"model_type {model_type!r} is not supported; supported: "
            + ", ".join(f"{m!r} ({a})" for m, a in FAMILIES.values()))
    family = families[model_type]
    architectures = d.get("architectures")
    expected = FAMILIES[family][1]
    if architectures and not any(a in (expected, expected.replace("ForCausalLM", "Model"))
                                 for a in architectures):
        raise ModelConfigError(f"architectures must include {expected!r}, got {architectures!r}")
    return family


def _check_hf_features(d: Mapping[str, Any], family: str) -> None:
    if d.get("hidden_act", "silu") != "silu":
        raise ModelConfigError(f"hidden_act must be 'silu', got {d['hidden_act']!r}")
    # Qwen2's q/k/v biases are implied by its family; an attention_bias field switches biases on
    # for every projection, o_proj included, which none of our families has.
    if d.get("attention_bias", False):
        raise ModelConfigError(
            f"attention_bias=True is not supported for {family} (q/k/v/o biases)")
    if d.get("mlp_bias", False):
        raise ModelConfigError("mlp_bias=True is not supported")
    if d.get("use_sliding_window", False):
        raise ModelConfigError("use_sliding_window=True is not supported (full attention only)")
    if d.get("pretraining_tp", 1) not in (1, None):
        raise ModelConfigError(f"pretraining_tp must be 1, got {d['pretraining_tp']!r}")
    layer_types = d.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise ModelConfigError(
            f"layer_types must all be 'full_attention', got {sorted(set(layer_types))}")


def _rope_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """Our rope fields from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`."""
    types = {}
    for field in ("rope_scaling", "rope_parameters"):
        if d.get(field):
            types[field] = d[field].get("rope_type", d[field].get("type", "default"))
            if types[field] not in ROPE_TYPES:
                raise ModelConfigError(f"{field} type {types[field]!r} is not supported; "
                                       f"supported: {ROPE_TYPES}")
    if len(set(types.values())) > 1:
        raise ModelConfigError(f"rope_scaling type {types['rope_scaling']!r} disagrees with "
                               f"rope_parameters type {types['rope_parameters']!r}")
    rope = {**(d.get("rope_scaling") or {}), **(d.get("rope_parameters") or {})}
    theta = rope.get("rope_theta", d.get("rope_theta", 1e6))
    rope_type = next(iter(types.values()), "default")
    fields = {"rope_theta": float(theta), "rope_type": rope_type}
    try:
        if rope_type in ("linear", "llama3"):
            fields["rope_factor"] = float(rope["factor"])
        if rope_type == "llama3":
            fields.update(rope_low_freq_factor=float(rope["low_freq_factor"]),
                          rope_high_freq_factor=float(rope["high_freq_factor"]),
                          rope_original_max_positions=int(
                              rope["original_max_position_embeddings"]))
    except KeyError as err:
        raise ModelConfigError(
            f"rope scaling {rope_type!r} is missing field {err.args[0]!r}") from err
    return fields
