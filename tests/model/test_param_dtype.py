"""model.param_dtype (parameter storage) and model.dtype (compute) are independent when loading
Hugging Face weights, through load_pretrained and through a run's build_model."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from matpo_jax.config import apply_overrides, base_config
from matpo_jax.model import load_pretrained, save_pretrained
from matpo_jax.run.runtime import build_model

BATCH = np.random.RandomState(3).randint(0, 128, (2, 10)).astype(np.int32)


def param_dtypes(model):
    return {leaf.dtype for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))}


def test_param_dtype_and_compute_dtype_are_independent(untied_checkpoint, untied_model, jit_apply,
                                                       tmp_path):
    import torch
    import transformers

    # A bfloat16 release (as Qwen3's) loads as float32 master weights or stays bfloat16.
    bf16_torch = copy.deepcopy(untied_checkpoint.torch_model).to(torch.bfloat16)
    release = str(tmp_path / "bf16_release")
    bf16_torch.save_pretrained(release)
    for param_dtype, dtype in (("float32", "bfloat16"), ("bfloat16", "bfloat16")):
        model = load_pretrained(release, dtype=dtype, param_dtype=param_dtype)
        assert param_dtypes(model) == {jnp.dtype(param_dtype)}
        assert (model.config.param_dtype, model.config.dtype) == (param_dtype, dtype)
    assert param_dtypes(load_pretrained(release)) == {jnp.dtype("float32")}
    # bfloat16 storage, float32 compute: float32 logits close to the float32 model's.
    model16 = load_pretrained(release, dtype="float32", param_dtype="bfloat16")
    assert param_dtypes(model16) == {jnp.dtype("bfloat16")}
    expected = np.asarray(jit_apply(untied_model, "__call__", jnp.asarray(BATCH)))
    logits = np.asarray(jit_apply(model16, "__call__", jnp.asarray(BATCH)))
    assert logits.dtype == np.float32
    assert np.abs(logits - expected).max() < 0.1 * np.abs(expected).max()
    # bfloat16 parameters are written as bfloat16 tensors that transformers reads back exactly.
    save_pretrained(model16, str(tmp_path / "saved"))
    reloaded = transformers.Qwen3ForCausalLM.from_pretrained(str(tmp_path / "saved"))
    original = bf16_torch.state_dict()
    assert reloaded.dtype == torch.bfloat16
    assert all(torch.equal(tensor, original[name])
               for name, tensor in reloaded.state_dict().items())


def test_build_model_honours_model_param_dtype(untied_checkpoint, make_mesh):
    cfg = apply_overrides(base_config(), {"model.hf_checkpoint": untied_checkpoint.path,
                                          "model.param_dtype": "bfloat16"})
    model = build_model(cfg, make_mesh(1, 8, 1))
    assert param_dtypes(model) == {jnp.dtype("bfloat16")}
    assert model.config.dtype == "float32"
