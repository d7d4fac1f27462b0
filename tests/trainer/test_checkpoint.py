"""Orbax checkpoints: bit-exact round trips, retention, atomicity and restoring onto a new mesh."""
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from matpo_jax.trainer.checkpoint import Checkpointer, abstract_like


def small_params(seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {
        "embed": jax.random.normal(k1, (16, 8), jnp.float32),
        "layers": {"kernel": jax.random.normal(k2, (8, 8), jnp.bfloat16),
                   "count": jnp.arange(4, dtype=jnp.int32)},
    }


def trained_state(seed=0, steps=2):
    """Params + adamw state after a few updates, so the moments are non-trivial."""
    params = small_params(seed)
    optimizer = optax.adamw(1e-2, weight_decay=0.01)
    opt_state = optimizer.init(params)
    for _ in range(steps):
        grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.5, params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return params, opt_state


def assert_trees_bitwise_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x).reshape(-1).view(np.uint8),
                                      np.asarray(y).reshape(-1).view(np.uint8))


def test_round_trip_is_bitwise_exact(tmp_path):
    params, opt_state = trained_state()
    rng = jax.random.fold_in(jax.random.key(7), 3)
    legacy_rng = jax.random.PRNGKey(11)
    data_state = {"next_index": 37, "epoch": 2, "shard": [0, 4]}
    with Checkpointer(tmp_path, async_save=True) as ckpt:
        assert ckpt.save(5, params=params, opt_state=opt_state, rng=rng, data_state=data_state,
                         metadata={"run": "unit"})
        ckpt.wait_until_finished()
        out = ckpt.restore_latest(params, jax.tree.map(jnp.zeros_like, opt_state))
    assert out.step == 5
    assert_trees_bitwise_equal(out.params, params)
    assert_trees_bitwise_equal(out.opt_state, opt_state)
    assert type(out.opt_state[0]).__name__ == "ScaleByAdamState"  # optax structure preserved
    np.testing.assert_array_equal(jax.random.key_data(out.rng), jax.random.key_data(rng))
    assert jax.random.key_impl(out.rng) == jax.random.key_impl(rng)
    # The restored key draws the same numbers as the saved one.
    np.testing.assert_array_equal(jax.random.uniform(out.rng, (3,)), jax.random.uniform(rng, (3,)))
    assert out.data_state == data_state
    assert out.metadata == {"run": "unit"}

    # Legacy uint32 keys and grain's bytes iterator states survive too (sync save this time).
    with Checkpointer(tmp_path / "legacy", async_save=False) as ckpt:
        ckpt.save(1, params=params, opt_state=opt_state, rng=legacy_rng, data_state=b'{"i": 3}')
        out = ckpt.restore_latest(abstract_like(params))
    np.testing.assert_array_equal(out.rng, legacy_rng)
    assert out.rng.dtype == jnp.uint32
    assert out.data_state == b'{"i": 3}'
    assert out.opt_state is None  # parameters only, e.g. for evaluation


def test_save_interval_keep_last_k_and_latest_step(tmp_path):
    params, opt_state = trained_state(steps=0)
    with Checkpointer(tmp_path, save_every=2, keep=2) as ckpt:
        assert ckpt.restore_latest(params) is None and ckpt.latest_step() is None
        saved = [s for s in range(7) if ckpt.save(s, params=params, opt_state=opt_state)]
        ckpt.wait_until_finished()
        assert saved == [0, 2, 4, 6]
        assert ckpt.all_steps() == [4, 6] and ckpt.latest_step() == 6
        assert ckpt.save(7, params=params, opt_state=opt_state, force=True)  # the final step
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [6, 7]
    # A fresh process (a resumed run) sees the same steps on disk.
    with Checkpointer(tmp_path, save_every=2, keep=2) as ckpt:
        assert ckpt.latest_step() == 7
        assert ckpt.restore_latest(params, opt_state).step == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["6", "7"]

    # checkpoint_every = 0: nothing but forced saves.
    with Checkpointer(tmp_path / "final_only", save_every=0) as ckpt:
        assert not any(ckpt.save(s, params=params, opt_state=opt_state) for s in range(3))
        assert ckpt.save(3, params=params, opt_state=opt_state, force=True)
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [3]


def test_partially_written_checkpoint_is_ignored(tmp_path):
    params, opt_state = trained_state()
    later_params = jax.tree.map(lambda x: x + 1, params)
    with Checkpointer(tmp_path, async_save=False) as ckpt:
        ckpt.save(3, params=params, opt_state=opt_state, data_state={"i": 3})
    # A crash while writing step 9: Orbax's temporary directory, holding a truncated copy.
    partial = tmp_path / "9.orbax-checkpoint-tmp-1700000000"
    shutil.copytree(tmp_path / "3", partial)
    for f in partial.rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 3
        out = ckpt.restore_latest(later_params, opt_state)
    assert out.step == 3 and out.data_state == {"i": 3}
    assert_trees_bitwise_equal(out.params, params)


def test_restore_onto_a_different_mesh(tmp_path, make_mesh):
    save_mesh, load_mesh = make_mesh(4, 2, 1), make_mesh(2, 1, 4)
    spec = {"embed": P("tensor", "fsdp"), "kernel": P("fsdp", "tensor"), "bias": P()}
    host = {"embed": np.arange(16 * 8, dtype=np.float32).reshape(16, 8),
            "kernel": np.linspace(-1, 1, 8 * 16, dtype=np.float32).reshape(8, 16),
            "bias": np.full((16,), 0.25, np.float32)}
    # Save sharded over data=4 x fsdp=2 (params sharded on fsdp, batch axes over data).
    on_save_mesh = {k: NamedSharding(save_mesh, P("data", *spec[k][1:]) if k == "embed"
                                     else spec[k]) for k in host}
    params = {k: jax.device_put(v, on_save_mesh[k]) for k, v in host.items()}
    opt_state = optax.adam(1e-3).init(params)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, params=params, opt_state=opt_state)

    # Restore onto data=2 x fsdp=1 x tensor=4 with the model's partition rules on that mesh.
    on_load_mesh = {k: NamedSharding(load_mesh, spec[k]) for k in host}
    target = abstract_like(jax.eval_shape(lambda: params), on_load_mesh)
    opt_target = abstract_like(
        jax.eval_shape(lambda: opt_state),
        jax.tree.map(lambda _: NamedSharding(load_mesh, P()), opt_state))
    with Checkpointer(tmp_path) as ckpt:
        out = ckpt.restore_latest(target, opt_target)
    for key, value in host.items():
        restored = out.params[key]
        assert restored.sharding == on_load_mesh[key]
        assert restored.sharding.mesh.shape == {"data": 2, "fsdp": 1, "tensor": 4}
        np.testing.assert_array_equal(np.asarray(restored), value)
    assert out.params["embed"].addressable_shards[0].data.shape == (4, 8)  # rows split 4 ways
    assert_trees_bitwise_equal(out.opt_state, opt_state)
    assert all(leaf.sharding.mesh.shape["tensor"] == 4 for leaf in jax.tree.leaves(out.opt_state))


def test_nnx_state_round_trip(tmp_path):
    """The trainer's parameters are a flax NNX State; Orbax must take and give back that type."""
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    optimizer = optax.adamw(1e-3)
    opt_state = optimizer.init(state)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(2, params=state, opt_state=opt_state)
        abstract = nnx.state(nnx.eval_shape(lambda: nnx.Linear(4, 3, rngs=nnx.Rngs(1))), nnx.Param)
        out = ckpt.restore_latest(abstract, jax.eval_shape(lambda: opt_state))
    fresh = nnx.Linear(4, 3, rngs=nnx.Rngs(1))
    nnx.update(fresh, out.params)
    np.testing.assert_array_equal(fresh.kernel[...], model.kernel[...])
    np.testing.assert_array_equal(fresh.bias[...], model.bias[...])


def test_shared_sft_start_restores_another_runs_params(tmp_path):
    """sft.init_checkpoint: RL runs start from the SFT params another run saved (not their own
    initialisation), and a directory without checkpoints is an error naming it."""
    import dataclasses

    from matpo_jax.config import base_config
    from matpo_jax.run.sft import restore_shared_start

    @dataclasses.dataclass
    class State:
        params: dict

        def replace(self, **changes):
            return dataclasses.replace(self, **changes)

    saved, opt_state = trained_state(seed=1)
    with Checkpointer(tmp_path / "sft", save_every=1, async_save=False) as ckpt:
        ckpt.save(7, params=saved, opt_state=opt_state, force=True)
    cfg = base_config()
    cfg.sft.init_checkpoint = str(tmp_path / "sft")
    restored = restore_shared_start(cfg, State(params=small_params(seed=2)))
    assert_trees_bitwise_equal(restored.params, saved)
    cfg.sft.init_checkpoint = str(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="sft.init_checkpoint=.*empty"):
        restore_shared_start(cfg, State(params=small_params(seed=2)))
