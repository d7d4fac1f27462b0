"""Checkpoint loading: the layouts real checkpoints come in, and clear errors for bad ones."""
import copy
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from matpo_jax.model import CheckpointFormatError, DecoderConfig, load_pretrained
from matpo_jax.model.hf_io import hf_name

WEIGHTS = "model.safetensors"
_DELETE = object()  # edit_config: remove the field
BATCH = np.arange(24, dtype=np.int32).reshape(2, 12) % 128


@pytest.fixture
def checkpoint_copy(untied_checkpoint, tmp_path):
    """A writable copy of the session checkpoint."""
    path = tmp_path / "ckpt"
    shutil.copytree(untied_checkpoint.path, path)
    return path


def edit_config(path, **changes):
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    for key, value in changes.items():
        if value is _DELETE:
            config.pop(key)
        else:
            config[key] = value
    config_path.write_text(json.dumps(config))


def edit_tensors(path, edit):
    tensors = load_file(str(path / WEIGHTS))
    edit(tensors)
    save_file(tensors, str(path / WEIGHTS), metadata={"format": "pt"})



def test_missing_directory_and_config(tmp_path):
    with pytest.raises(CheckpointFormatError, match="does not exist"):
        load_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(CheckpointFormatError, match="config.json"):
        load_pretrained(str(tmp_path))


def test_missing_tensor_is_named(checkpoint_copy):
    edit_tensors(checkpoint_copy, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    missing = r"missing tensor 'model\.layers\.1\.mlp\.down_proj\.weight'"
    with pytest.raises(CheckpointFormatError, match=missing):
        load_pretrained(str(checkpoint_copy))


def test_wrong_shape_names_tensor_and_both_shapes(checkpoint_copy):
    name = "model.layers.0.self_attn.k_proj.weight"  # [kv_heads * head_dim, hidden] = [32, 64]

    def shrink(tensors):
        tensors[name] = tensors[name][:16]

    edit_tensors(checkpoint_copy, shrink)
    with pytest.raises(CheckpointFormatError) as err:
        load_pretrained(str(checkpoint_copy))
    assert name in str(err.value) and "(16, 64)" in str(err.value) and "(32, 64)" in str(err.value)


def test_unexpected_tensor_is_named(checkpoint_copy):
    edit_tensors(checkpoint_copy, lambda t: t.update(
        {"model.layers.2.mlp.up_proj.weight": np.zeros((96, 64), np.float32)}))
    with pytest.raises(CheckpointFormatError, match=r"unexpected tensors.*layers\.2\.mlp\.up_proj"):
        load_pretrained(str(checkpoint_copy))


@pytest.mark.parametrize("changes, field", [
    (dict(model_type="gemma3"), "model_type 'gemma3' is not supported; supported: 'qwen3'"),
    (dict(architectures=["LlamaForCausalLM"]), "architectures"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(use_sliding_window=True, sliding_window=4), "use_sliding_window"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
     "rope_parameters type 'yarn' is not supported"),
    (dict(rope_parameters=_DELETE, rope_scaling={"type": "dynamic", "factor": 2.0}),
     "rope_scaling type 'dynamic' is not supported"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}),
     "rope_scaling type 'linear' disagrees with rope_parameters type 'default'"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0}),
     "rope scaling 'llama3' is missing field 'low_freq_factor'"),
    (dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(hidden_size=_DELETE), "hidden_size"),
    (dict(num_attention_heads=3), "num_attention_heads"),
])
def test_unsupported_config_names_the_field(checkpoint_copy, changes, field):
    edit_config(checkpoint_copy, **changes)
    with pytest.raises(CheckpointFormatError, match=field) as err:
        load_pretrained(str(checkpoint_copy))
    assert "config.json" in str(err.value)


def test_sharded_checkpoint_with_and_without_index(untied_checkpoint, untied_model, tmp_path,
                                                  jit_apply):
    path = tmp_path / "sharded"
    untied_checkpoint.torch_model.save_pretrained(str(path), max_shard_size="40KB")
    assert os.path.exists(path / "model.safetensors.index.json")
    assert len([f for f in os.listdir(path) if f.endswith(".safetensors")]) > 1
    expected = jit_apply(untied_model, "__call__", jnp.asarray(BATCH))
    logits = lambda: jit_apply(load_pretrained(str(path)), "__call__", jnp.asarray(BATCH))
    np.testing.assert_array_equal(logits(), expected)
    os.remove(path / "model.safetensors.index.json")
    np.testing.assert_array_equal(logits(), expected)


def test_legacy_config_and_bfloat16_weights(untied_checkpoint, untied_model, tmp_path, jit_apply):
    """Released Qwen3 checkpoints: top-level rope_theta, rope_scaling null, bfloat16 tensors."""
    import torch

    path = tmp_path / "bf16"
    # A copy: casting the shared session model in place would round its weights for other tests.
    copy.deepcopy(untied_checkpoint.torch_model).to(torch.bfloat16).save_pretrained(str(path))
    edit_config(path, rope_parameters=_DELETE, rope_theta=5000.0, rope_scaling=None)
    model = load_pretrained(str(path))
    assert model.config.rope_theta == 5000.0
    assert model.embed_tokens.embedding[...].dtype == jnp.float32
    logits = jit_apply(model, "__call__", jnp.asarray(BATCH))
    expected = jit_apply(untied_model, "__call__", jnp.asarray(BATCH))
    assert float(jnp.abs(logits - expected).max()) < 0.05 * float(jnp.abs(expected).max())


def test_config_round_trip_and_validation():
    config = DecoderConfig(vocab_size=10, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4, rope_theta=123.0)
    assert DecoderConfig.from_hf_dict(config.to_hf_dict()) == config
    assert hf_name("layers/3/self_attn/q_norm/scale") == "model.layers.3.self_attn.q_norm.weight"
    assert hf_name("lm_head/kernel") == "lm_head.weight"
    with pytest.raises(ValueError, match="dtype"):
        config.replace(dtype="float16")
    with pytest.raises(ValueError, match="head_dim"):
        config.replace(head_dim=5)
