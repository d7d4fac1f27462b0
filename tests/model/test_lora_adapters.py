"""LoRA adapters on the decoder (model/lora.py): fresh adapters and adapters off are the base
bit for bit; a packed row mixing roles gives each token its own role's adapter; the KV-cache
path applies each row's adapter as the full forward does; bad settings name the field."""
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from matpo_jax import parallel
from matpo_jax.config import sections
from matpo_jax.model import CausalLM, DecoderConfig, init_cache
from matpo_jax.model import lora as lora_lib

CONFIG = DecoderConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def adapted_model(roles="per_role", seed=0, targets=lora_lib.TARGETS, config=CONFIG,
                  base_dtype=None):
    """A tiny model with adapters whose B is random (fresh ones would change nothing)."""
    model = CausalLM(config, rngs=nnx.Rngs(0))
    lora_lib.add_adapters(model, lora_lib.LoRAConfig(rank=4, alpha=8.0, targets=targets,
                                                     roles=roles, base_dtype=base_dtype),
                          seed=seed)
    graphdef, adapters, base = lora_lib.split_trainable(model)
    keys = iter(jax.random.split(jax.random.key(seed + 1), len(jax.tree.leaves(adapters))))
    adapters = jax.tree.map(lambda x: x + 0.2 * jax.random.normal(next(keys), x.shape), adapters)
    return nnx.merge(graphdef, adapters, base)


def tokens(rows, length, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(1, CONFIG.vocab_size, (rows, length)),
                       jnp.int32)


def test_fresh_adapters_and_adapters_off_are_the_base_exactly():
    base = CausalLM(CONFIG, rngs=nnx.Rngs(0))
    x = tokens(2, 12)
    expected = np.asarray(base(x))
    fresh = CausalLM(CONFIG, rngs=nnx.Rngs(0))
    lora_lib.add_adapters(fresh, lora_lib.LoRAConfig(rank=4, alpha=8.0, roles="per_role"))
    np.testing.assert_array_equal(np.asarray(fresh(x, roles=jnp.ones_like(x))), expected)
    trained = adapted_model()
    off = jnp.full_like(x, lora_lib.ADAPTERS_OFF)
    np.testing.assert_array_equal(np.asarray(trained(x, roles=off)), expected)
    # ... and the adapters do act when on.
    assert np.abs(np.asarray(trained(x, roles=jnp.zeros_like(x))) - expected).max() > 1e-2


def test_split_trains_the_adapters_and_freezes_every_base_parameter():
    model = adapted_model()
    _, adapters, frozen = lora_lib.split_trainable(model)
    paths = [parallel.path_to_str(path)
             for path, _ in jax.tree_util.tree_flatten_with_path(adapters)[0]]
    # 2 layers x 7 projections x (A, B)
    assert len(paths) == 28 and all(re.search(r"_proj/lora_(a|b)$", p) for p in paths)
    base_params = nnx.state(CausalLM(CONFIG, rngs=nnx.Rngs(0)), nnx.Param)
    assert len(jax.tree.leaves(frozen)) == len(jax.tree.leaves(base_params))
    # A model without adapters trains every parameter, as before.
    _, params, rest = lora_lib.split_trainable(CausalLM(CONFIG, rngs=nnx.Rngs(0)))
    assert len(jax.tree.leaves(params)) == len(jax.tree.leaves(base_params))
    assert not jax.tree.leaves(rest)


def test_a_packed_row_mixing_roles_gives_each_token_its_roles_adapter():
    model = adapted_model()
    planner, worker = tokens(1, 7, seed=1), tokens(1, 9, seed=2)
    # One packed row: planner segment 1, worker segment 2, then padding.
    row = jnp.concatenate([planner, worker, jnp.zeros((1, 4), jnp.int32)], axis=1)
    segments = jnp.asarray([[1] * 7 + [2] * 9 + [0] * 4])
    positions = jnp.asarray([list(range(7)) + list(range(9)) + [0] * 4])
    roles = jnp.asarray([[0] * 7 + [1] * 9 + [0] * 4])
    mixed = np.asarray(model(row, positions, segments, roles=roles)[0])
    alone_planner = np.asarray(model(planner, roles=jnp.zeros_like(planner))[0])
    alone_worker = np.asarray(model(worker, roles=jnp.ones_like(worker))[0])
    np.testing.assert_allclose(mixed[:7], alone_planner, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mixed[7:16], alone_worker, rtol=1e-5, atol=1e-5)
    # The other role's adapter gives other logits: the selection is what matched.
    wrong = np.asarray(model(worker, roles=jnp.zeros_like(worker))[0])
    assert np.abs(wrong - alone_worker).max() > 1e-2


def test_shared_adapter_serves_every_role_alike():
    model = adapted_model(roles="shared")
    x = tokens(1, 10, seed=3)
    np.testing.assert_array_equal(np.asarray(model(x, roles=jnp.zeros_like(x))),
                                  np.asarray(model(x, roles=jnp.ones_like(x))))


def test_cached_extend_and_decode_apply_each_rows_adapter():
    model = adapted_model()
    x = tokens(2, 10, seed=4)
    roles = jnp.asarray([1, 0])  # row 0 a worker, row 1 a planner
    full = np.asarray(model(x, roles=jnp.broadcast_to(roles[:, None], x.shape)))
    cache = init_cache(CONFIG, 2, 16)
    logits, cache = model.extend(x[:, :9], jnp.asarray([9, 9]), cache, roles)
    np.testing.assert_allclose(np.asarray(logits), full[:, :9], rtol=1e-5, atol=1e-5)
    last, _ = model.decode(x[:, 9], cache, jnp.asarray([True, True]), roles)
    np.testing.assert_allclose(np.asarray(last), full[:, 9], rtol=1e-5, atol=1e-5)


def test_a_bfloat16_base_under_bfloat16_compute_is_the_float32_base_bit_for_bit():
    config = dataclasses.replace(CONFIG, dtype="bfloat16")
    wide, narrow = adapted_model(config=config), adapted_model(config=config,
                                                                base_dtype="bfloat16")
    _, wide_adapters, wide_base = lora_lib.split_trainable(wide)
    _, narrow_adapters, narrow_base = lora_lib.split_trainable(narrow)
    assert {x.dtype for x in jax.tree.leaves(wide_base)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(narrow_base)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(narrow_adapters)} == {jnp.dtype(jnp.float32)}
    x = tokens(2, 10, seed=5)
    roles = jnp.broadcast_to(jnp.asarray([1, 0])[:, None], x.shape)
    np.testing.assert_array_equal(np.asarray(narrow(x, roles=roles), np.float32),
                                  np.asarray(wide(x, roles=roles), np.float32))
    # The adapters' gradients too (what the train step uses), and the cached decode path.
    def loss(graphdef, base):
        return lambda adapters: nnx.merge(graphdef, adapters, base)(
            x, roles=roles).astype(jnp.float32).std()
    for grad_wide, grad_narrow in zip(
            jax.tree.leaves(jax.grad(loss(*lora_lib.split_trainable(wide)[::2]))(wide_adapters)),
            jax.tree.leaves(jax.grad(loss(*lora_lib.split_trainable(narrow)[::2]))(
                narrow_adapters))):
        np.testing.assert_array_equal(np.asarray(grad_narrow), np.asarray(grad_wide))
    caches = [init_cache(config, 2, 16) for _ in range(2)]
    (a, _), (b, _) = [m.extend(x, jnp.asarray([10, 10]), c, jnp.asarray([1, 0]))
                      for m, c in zip((wide, narrow), caches)]
    np.testing.assert_array_equal(np.asarray(b, np.float32), np.asarray(a, np.float32))


def test_bad_settings_name_the_field():
    with pytest.raises(lora_lib.LoRAConfigError, match="model.lora.rank"):
        lora_lib.LoRAConfig(rank=0, alpha=1.0)
    with pytest.raises(lora_lib.LoRAConfigError, match="model.lora.targets"):
        lora_lib.LoRAConfig(rank=2, alpha=1.0, targets=("qkv",))
    with pytest.raises(lora_lib.LoRAConfigError, match="model.lora.roles"):
        lora_lib.LoRAConfig(rank=2, alpha=1.0, roles="each")
    with pytest.raises(lora_lib.LoRAConfigError, match="model.lora.base_dtype"):
        lora_lib.LoRAConfig(rank=2, alpha=1.0, base_dtype="int8")


def test_config_choices_equal_the_model_modules():
    assert sections.LORA_TARGETS == lora_lib.TARGETS
    assert sections.LORA_ROLES == lora_lib.ROLE_MODES
    assert sections.DTYPES == lora_lib.BASE_DTYPES
