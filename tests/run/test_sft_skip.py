"""sft.steps = 0 skips SFT: no optimizer is built (its schedule needs a step), no checkpoint is
written, and RL starts from the model as it is."""
from types import SimpleNamespace

import jax
import numpy as np
from flax import nnx

from matpo_jax import parallel
from matpo_jax.config import base_config
from matpo_jax.run.sft import run_sft


def test_zero_sft_steps_return_the_model_untrained(tiny_model, tmp_path):
    cfg = base_config()
    cfg.sft.steps = 0
    rt = SimpleNamespace(cfg=cfg, mesh=parallel.make_mesh(devices=jax.devices()[:1]),
                         path=lambda *parts: str(tmp_path.joinpath(*parts)))
    graphdef, state = run_sft(rt, tiny_model, writer=None)
    expected = nnx.state(tiny_model, nnx.Param)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(state.step) == 0 and not list(tmp_path.iterdir())
