"""Checkpoints that fall back: a truncated, corrupt or empty newest checkpoint is named in a one-line
warning, set aside, and the newest valid one is restored; rotation then never deletes it; when no
checkpoint restores nothing is set aside and the error names the directory."""
import logging
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from matpo_jax.trainer.checkpoint import Checkpointer


def params_at(step):
    return {"w": jnp.arange(32.0).reshape(4, 8) + step, "b": jnp.full((8,), float(step))}


def counters_at(step):
    return {"step": jnp.int32(step), "rng": jax.random.key_data(jax.random.key(step))}


def save_steps(directory, steps, keep=3):
    opt = optax.adam(1e-3).init(params_at(0))
    with Checkpointer(directory, keep=keep, async_save=False) as ckpt:
        for step in steps:
            ckpt.save(step, params=params_at(step), opt_state=opt, extras=counters_at(step),
                      data_state={"i": step}, force=True)
    return opt


def truncate_arrays(step_dir):
    for f in (step_dir / "params").rglob("*"):
        if f.is_file() and f.parent.name == "d":  # the array data files
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def corrupt_meta(step_dir):
    (step_dir / "meta" / "metadata").write_text('{"step": 4, "rng"')


def empty_directory(step_dir):
    shutil.rmtree(step_dir)
    step_dir.mkdir()


def non_finite_params(step_dir):
    # What a run saved before the non-finite guard: it reads back, but is not a valid start.
    shutil.rmtree(step_dir)
    opt = optax.adam(1e-3).init(params_at(0))
    with Checkpointer(step_dir.parent, keep=5, async_save=False) as ckpt:
        nan = jax.tree.map(lambda x: x * jnp.nan, params_at(4))
        ckpt.save(4, params=nan, opt_state=opt, extras=counters_at(4), force=True)


@pytest.mark.parametrize("damage", [truncate_arrays, corrupt_meta, empty_directory,
                                    non_finite_params], ids=lambda f: f.__name__)
def test_a_bad_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, damage):
    opt = save_steps(tmp_path, [2, 3, 4])
    damage(tmp_path / "4")
    with caplog.at_level(logging.WARNING), Checkpointer(tmp_path, keep=3) as ckpt:
        assert ckpt.all_steps() == [2, 3, 4]
        out = ckpt.restore_latest(params_at(0), opt, extras=counters_at(0))
        assert out.step == 3 and out.data_state == {"i": 3}
        np.testing.assert_array_equal(out.params["w"], params_at(3)["w"])
        assert int(out.extras["step"]) == 3
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                    and r.name == "matpo_jax.trainer.checkpoint"]
        assert len(warnings) == 1 and "\n" not in warnings[0]
        assert f"checkpoint {tmp_path / '4'} is unreadable" in warnings[0]
        assert ckpt.all_steps() == [2, 3]
        # The run goes on and saves 4 and 5 again; rotation (keep 3) drops only the oldest.
        for step in (4, 5):
            ckpt.save(step, params=params_at(step), opt_state=opt, force=True)
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [3, 4, 5]
    assert (tmp_path / "4.invalid").is_dir()  # kept for a post-mortem, never counted


def test_when_no_checkpoint_restores_nothing_is_set_aside(tmp_path):
    opt = save_steps(tmp_path, [1, 2])
    other_model = {"w": jnp.zeros((3, 3)), "b": jnp.zeros((8,))}  # fits no checkpoint
    with Checkpointer(tmp_path) as ckpt:
        with pytest.raises(RuntimeError, match=f"no checkpoint in {tmp_path} restores"):
            ckpt.restore_latest(other_model, opt)
        assert ckpt.all_steps() == [1, 2]
    assert not list(tmp_path.glob("*.invalid*"))
