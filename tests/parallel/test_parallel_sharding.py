"""Mesh, partition rules and sharded execution on 8 simulated CPU devices."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, PartitionSpec as P
from safetensors.numpy import load_file

from matpo_jax import parallel
from matpo_jax.model import (DecoderConfig, CausalLM, init_cache, load_pretrained,
                             save_pretrained)

CONFIG = DecoderConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16)
TOKENS = np.random.RandomState(0).randint(0, 128, (4, 10)).astype(np.int32)


def flat_params(model):
    leaves = jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]
    return {parallel.path_to_str(path): leaf for path, leaf in leaves}


def jitted_forward(model):
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
    return lambda tokens: forward(state, tokens)


@pytest.fixture(scope="module")
def reference():
    """An unsharded model and its logits on TOKENS."""
    model = CausalLM(CONFIG, rngs=nnx.Rngs(0))
    return model, np.asarray(jitted_forward(model)(jnp.asarray(TOKENS)))


@pytest.mark.parametrize("sizes", [(2, 2, 2), (1, 4, 2), (8, 1, 1), (1, 1, 8)])
def test_make_mesh_shapes(sizes):
    mesh = parallel.make_mesh(data=sizes[0], fsdp=sizes[1], tensor=sizes[2])
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert tuple(mesh.shape.values()) == sizes
    assert all(t == AxisType.Auto for t in mesh.axis_types)


def test_make_mesh_from_dict_fill_and_errors():
    mesh = parallel.make_mesh({"fsdp": -1, "tensor": 2})
    assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    with pytest.raises(ValueError, match=r"mesh.data\*mesh.fsdp\*mesh.tensor = 6 but 8 devices"):
        parallel.make_mesh(data=3, tensor=2)
    with pytest.raises(ValueError, match="unknown mesh axes"):
        parallel.make_mesh({"model": 2})


@pytest.mark.parametrize("tied", [False, True])
def test_rules_cover_every_parameter(tied):
    model = nnx.eval_shape(lambda: CausalLM(CONFIG.replace(tie_word_embeddings=tied),
                                                    rngs=nnx.Rngs(0)))
    specs = {path: parallel.spec_for(path) for path in flat_params(model)}
    assert specs["embed_tokens/embedding"] == P("tensor", "fsdp")
    assert specs["layers/1/self_attn/k_proj/kernel"] == P("fsdp", "tensor")
    assert specs["layers/1/self_attn/o_proj/kernel"] == P("tensor", "fsdp")
    assert specs["layers/0/mlp/down_proj/kernel"] == P("tensor", "fsdp")
    assert specs["layers/0/self_attn/q_norm/scale"] == P()
    assert specs["norm/scale"] == P()
    assert ("lm_head/kernel" in specs) == (not tied)


def test_unmatched_parameter_is_named():
    with pytest.raises(parallel.UnmatchedParameterError, match="layers/0/adapter/kernel"):
        parallel.spec_for("layers/0/adapter/kernel")
    rules = [(r"kernel$|embedding$", P("fsdp"))]
    with pytest.raises(parallel.UnmatchedParameterError, match="norm/scale"):
        parallel.param_shardings(nnx.state(CausalLM(CONFIG, rngs=nnx.Rngs(0))),
                                 parallel.make_mesh(fsdp=8), rules)


def test_indivisible_dimension_is_replicated():
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    assert parallel.fit_spec(P("tensor", "fsdp"), (127, 64), mesh) == P(None, "fsdp")
    assert parallel.fit_spec(P(("data", "fsdp")), (6, 3), mesh) == P()
    assert parallel.batch_sharding(mesh).spec == P(("data", "fsdp"))


@pytest.mark.parametrize("sizes", [(2, 2, 2), (1, 4, 2)])
def test_sharded_forward_matches_unsharded(sizes, reference):
    model, expected = reference
    mesh = parallel.make_mesh(data=sizes[0], fsdp=sizes[1], tensor=sizes[2])
    sharded = parallel.shard_model(nnx.clone(model), mesh)
    params = flat_params(sharded)
    for path, leaf in params.items():
        assert leaf.sharding.spec == parallel.spec_for(path), path
    # Really split: each device holds a quarter of an MLP kernel (fsdp x tensor).
    up = params["layers/0/mlp/up_proj/kernel"]
    assert up.addressable_shards[0].data.shape == (64 // sizes[1], 96 // sizes[2])
    tokens = jax.device_put(jnp.asarray(TOKENS), parallel.batch_sharding(mesh))
    logits = jitted_forward(sharded)(tokens)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-5, rtol=1e-5)


def test_sharded_prefill_matches_unsharded(reference):
    model, expected = reference
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    graphdef, state = nnx.split(parallel.shard_model(nnx.clone(model), mesh))
    cache = init_cache(CONFIG, batch=4, max_len=12)
    cache = jax.device_put(cache, parallel.cache_shardings(cache, mesh))
    assert all(k.sharding.spec == P(("data", "fsdp"), "tensor") for k in cache.k + cache.v)
    prefill = jax.jit(lambda state, t, n, c: nnx.merge(graphdef, state).prefill(t, n, c))
    lengths = jnp.array([10, 4, 7, 1])
    logits, cache = prefill(state, jnp.asarray(TOKENS), lengths, cache)
    for b, n in enumerate(lengths.tolist()):
        np.testing.assert_allclose(np.asarray(logits[b, :n]), expected[b, :n], atol=1e-5, rtol=1e-5)
    assert cache.lengths.tolist() == lengths.tolist()


def test_load_pretrained_onto_mesh(untied_checkpoint, untied_model, jit_apply, tmp_path):
    mesh = parallel.make_mesh(data=1, fsdp=4, tensor=2)
    model = load_pretrained(untied_checkpoint.path, mesh=mesh)
    for path, leaf in flat_params(model).items():
        assert leaf.sharding.mesh == mesh
        assert leaf.sharding.spec == parallel.spec_for(path), path
    assert flat_params(model)["lm_head/kernel"].addressable_shards[0].data.shape == (16, 64)
    tokens = jax.device_put(jnp.asarray(TOKENS), parallel.batch_sharding(mesh))
    expected = jit_apply(untied_model, "__call__", jnp.asarray(TOKENS))
    np.testing.assert_allclose(np.asarray(jitted_forward(model)(tokens)), np.asarray(expected),
                               atol=1e-5, rtol=1e-5)
    # Saving gathers the shards back into exactly the tensors that were loaded.
    save_pretrained(model, str(tmp_path))
    saved, original = (load_file(os.path.join(p, "model.safetensors"))
                       for p in (str(tmp_path), untied_checkpoint.path))
    assert saved.keys() == original.keys()
    for name in original:
        np.testing.assert_array_equal(saved[name], original[name], err_msg=name)


def test_optimizer_state_shards_with_parameter_rules(reference):
    model, _ = reference
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    params = nnx.state(model, nnx.Param)
    opt_state = optax.adamw(1e-3).init(params)
    shardings = parallel.param_shardings(opt_state, mesh)
    flat = {parallel.path_to_str(path): s for path, s in
            jax.tree_util.tree_flatten_with_path(shardings)[0]}
    mu_paths = [p for p in flat if p.endswith("mu/layers/0/mlp/down_proj/kernel")]
    assert len(mu_paths) == 1 and flat[mu_paths[0]].spec == P("tensor", "fsdp")
    assert any(p.endswith("count") and s.spec == P() for p, s in flat.items())
    placed = jax.device_put(opt_state, shardings)
    assert jax.tree_util.tree_leaves(placed)[-1].sharding.mesh == mesh


def test_maybe_initialize_distributed_only_on_multi_host(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    for name in ("MATPO_DISTRIBUTED", "JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS",
                 "TPU_WORKER_HOSTNAMES", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    assert parallel.maybe_initialize_distributed() is False and not calls
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")  # a single-host TPU VM
    assert parallel.maybe_initialize_distributed() is False and not calls
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.1,10.0.0.2")
    assert parallel.maybe_initialize_distributed() is True and len(calls) == 1
    assert parallel.is_multi_host_env({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})
    assert parallel.is_multi_host_env({"SLURM_NTASKS": "4"})
    assert not parallel.is_multi_host_env({"SLURM_NTASKS": "1"})
    assert parallel.maybe_initialize_distributed(force=False) is False and len(calls) == 1
