"""model.attention.<path>: what each choice runs on each backend, the explicit (logged)
fallbacks, the config error naming the field, and the decoder running a kernel end to end."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from matpo_jax.model import CausalLM, DecoderConfig, ModelConfigError
from matpo_jax.model import attention_dispatch
from matpo_jax.model.attention_dispatch import plan_train_attention


def test_auto_runs_the_reference_on_the_cpu_and_the_kernels_elsewhere():
    assert plan_train_attention("auto", True, "cpu") == ("xla", False, None)
    assert plan_train_attention("auto", True, "tpu") == ("splash", False, None)
    assert plan_train_attention("auto", True, "gpu") == ("cudnn", False, None)
    assert plan_train_attention("pallas_gpu", False, "gpu") == ("pallas_gpu", False, None)


def test_a_rule_a_kernel_cannot_express_falls_back_and_says_so():
    plan = plan_train_attention("pallas_gpu", True, "gpu")
    assert plan.implementation == "xla"
    assert "model.attention.train=pallas_gpu" in plan.note and "prefix_ids" in plan.note


def test_off_its_backend_a_kernel_interprets_or_falls_back():
    splash = plan_train_attention("splash", True, "cpu")
    assert (splash.implementation, splash.interpret) == ("splash", True)
    assert "interpret" in splash.note
    cudnn = plan_train_attention("cudnn", False, "cpu")
    assert cudnn.implementation == "xla" and "needs a gpu backend" in cudnn.note


def test_an_unknown_choice_names_the_field():
    with pytest.raises(ValueError, match="model.attention.train"):
        plan_train_attention("flash", False, "cpu")
    with pytest.raises(ModelConfigError, match="attention_decode"):
        DecoderConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                      attention_decode="splash")


def test_the_fallback_is_logged(caplog):
    q = jnp.ones((1, 8, 2, 4))
    kv = jnp.ones((1, 8, 1, 4))
    segments = jnp.ones((1, 8), jnp.int32)
    with caplog.at_level(logging.WARNING, logger=attention_dispatch.__name__):
        attention_dispatch._logged.clear()
        attention_dispatch.train_attention(q, kv, kv, segments, segments, "pallas_gpu")
    assert any("cannot express the shared-prompt rule" in r.message for r in caplog.records)


TINY = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def _logits(config, tokens, segments, prefixes):
    model = CausalLM(config, rngs=nnx.Rngs(0))
    return np.asarray(model(tokens, segment_ids=segments, prefix_ids=prefixes))


def test_the_decoder_runs_splash_like_the_reference():
    tokens = jax.random.randint(jax.random.key(1), (2, 48), 0, 64)
    segments = jnp.asarray([[1] * 16 + [2] * 16 + [3] * 16, [4] * 20 + [5] * 20 + [0] * 8])
    prefixes = jnp.asarray([[0] * 16 + [1] * 32, [0] * 48])
    reference = _logits(TINY, tokens, segments, prefixes)
    # auto on the CPU is the reference itself, to the bit.
    np.testing.assert_array_equal(
        _logits(TINY.replace(attention_train="auto"), tokens, segments, prefixes), reference)
    np.testing.assert_array_equal(
        _logits(TINY.replace(attention_train="xla"), tokens, segments, prefixes), reference)
    splash = _logits(TINY.replace(attention_train="splash"), tokens, segments, prefixes)
    np.testing.assert_allclose(splash, reference, atol=2e-5, rtol=2e-5)
