"""The Llama and Qwen2 families against transformers' PyTorch models on tiny random checkpoints:
forward, packed rows, the KV cache, and export back to the same architecture. (Qwen3's own
parity tests are in test_qwen3_parity.py; the real SmolLM2 weights in test_smollm2_real.py.)"""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from matpo_jax.model import DecoderConfig, init_cache, load_pretrained, save_pretrained

TOL = 1e-4
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16)
# Llama 3.x's rotary scaling with a short original context, so that all three frequency bands
# (kept, blended, stretched) occur among head_dim / 2 = 8 frequencies.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=LLAMA3_ROPE)),
    "llama-linear": ("LlamaConfig", "LlamaForCausalLM",
                     dict(rope_parameters={"rope_type": "linear", "rope_theta": 5000.0,
                                           "factor": 2.0})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(rope_parameters={"rope_type": "default", "rope_theta": 5000.0})),
}


def tokens(shape, seed=0, vocab=128):
    return np.random.RandomState(seed).randint(0, vocab, shape).astype(np.int32)


def torch_logits(model, batch):
    import torch
    with torch.no_grad():
        return model(torch.tensor(np.asarray(batch))).logits.numpy()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_checkpoint(request, tmp_path_factory):
    """(name, path, torch model): a random transformers model of the family, weights drawn large
    (norm scales away from 1, biases non-zero) so that every component moves the logits."""
    import torch
    import transformers

    config_class, model_class, extra = FAMILIES[request.param]
    config = getattr(transformers, config_class)(**TINY, tie_word_embeddings=False,
                                                 max_position_embeddings=512, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 1.0 if "norm" in name else 0.0
            param.copy_(scale + (0.3 if "norm" in name else 0.15) * torch.randn_like(param))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(str(path))
    return request.param, str(path), model


def test_forward_matches_transformers(family_checkpoint, jit_apply):
    name, path, torch_model = family_checkpoint
    model = load_pretrained(path)
    assert model.config.family == name.split("-")[0]
    layer = model.layers[0].self_attn
    assert not hasattr(layer, "q_norm")  # neither family normalises q/k heads
    assert (layer.q_proj.bias is not None) == (name == "qwen2")  # Qwen2's q/k/v biases
    # Positions past the original context exercise llama3's stretched frequencies.
    batch = tokens((2, 80), seed=1)
    expected = torch_logits(torch_model, batch)
    assert np.abs(expected).max() > 1.0
    diff = float(np.abs(np.asarray(jit_apply(model, "__call__", jnp.asarray(batch))) - expected).max())
    print(f"\n{name} forward vs transformers: max|diff|={diff:.2e}")
    assert diff < TOL


def test_rope_settings_reach_the_forward(family_checkpoint, jit_apply):
    """The rotary settings matter: the same weights with another scaling differ, so the parity
    above would catch a scaling we ignored (or a family whose settings the forward never reads)."""
    name, path, torch_model = family_checkpoint
    model = load_pretrained(path)
    batch = jnp.asarray(tokens((1, 80), seed=2))
    loaded = np.asarray(jit_apply(model, "__call__", batch))
    other = ("linear" if model.config.rope_type == "default" else "default")
    model.config = model.config.replace(rope_type=other, rope_factor=2.0)
    changed = np.asarray(jit_apply(model, "__call__", batch))
    assert np.abs(loaded - changed).max() > 1e-2


def test_packed_rows_and_cache_match_the_full_forward(family_checkpoint, jit_apply):
    name, path, torch_model = family_checkpoint
    model = load_pretrained(path)
    first, second = tokens((1, 9), seed=3), tokens((1, 6), seed=4)
    row = np.concatenate([first, second, np.zeros((1, 3), np.int32)], axis=1)
    positions = np.concatenate([np.arange(9), np.arange(6), np.zeros(3, int)])[None]
    segments = np.array([[1] * 9 + [2] * 6 + [0] * 3])
    packed = np.asarray(jit_apply(model, "__call__", jnp.asarray(row), jnp.asarray(positions),
                                  jnp.asarray(segments)))
    assert np.abs(packed[0, :9] - torch_logits(torch_model, first)[0]).max() < TOL
    assert np.abs(packed[0, 9:15] - torch_logits(torch_model, second)[0]).max() < TOL

    sequence = tokens((1, 12), seed=5)
    expected = torch_logits(torch_model, sequence)[0]
    cache = init_cache(model.config, batch=1, max_len=16)
    logits, cache = jit_apply(model, "prefill", jnp.asarray(sequence[:, :8]), jnp.array([8]),
                              cache)
    diffs = [np.abs(np.asarray(logits[0]) - expected[:8]).max()]
    for t in range(8, 12):
        logits, cache = jit_apply(model, "decode", jnp.asarray(sequence[:, t]), cache,
                                  jnp.ones(1, bool))
        diffs.append(np.abs(np.asarray(logits[0]) - expected[t]).max())
    print(f"\n{name} packed / prefill+decode vs transformers: max|diff|={max(diffs):.2e}")
    assert max(diffs) < TOL


def test_save_pretrained_loads_back_as_the_same_architecture(family_checkpoint, tmp_path):
    import transformers

    name, path, torch_model = family_checkpoint
    model = load_pretrained(path)
    save_pretrained(model, str(tmp_path))
    with open(os.path.join(tmp_path, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == [type(torch_model).__name__]
    assert DecoderConfig.from_hf_dict(config) == model.config
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(reloaded) is type(torch_model)
    batch = tokens((2, 70), seed=6)
    diff = np.abs(torch_logits(reloaded, batch) - torch_logits(torch_model, batch)).max()
    assert diff < 1e-6
