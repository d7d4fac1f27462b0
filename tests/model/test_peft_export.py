"""Our LoRA adapters exported in PEFT's format load in PyTorch (transformers + peft) onto the
base checkpoint and give our logits: per-role adapters as two PEFT adapters of one base, the
shared adapter as one, the base with adapters disabled, and the merged weights."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from matpo_jax.model import load_pretrained
from matpo_jax.model import lora as lora_lib
from matpo_jax.model import peft_io
from matpo_jax.model.hf_io import save_params

TOL = 1e-4


def with_adapters(path, roles, targets=lora_lib.TARGETS):
    """The base loaded from `path` with adapters whose B is random (B = 0 would hide a layout
    error: every update would be zero)."""
    model = load_pretrained(path)
    lora_lib.add_adapters(model, lora_lib.LoRAConfig(rank=4, alpha=8.0, targets=targets,
                                                     roles=roles), seed=5)
    graphdef, adapters, base = lora_lib.split_trainable(model)
    keys = iter(jax.random.split(jax.random.key(6), len(jax.tree.leaves(adapters))))
    adapters = jax.tree.map(lambda x: x + 0.2 * jax.random.normal(next(keys), x.shape), adapters)
    return nnx.merge(graphdef, adapters, base)


def ours(model, batch, role):
    x = jnp.asarray(batch)
    return np.asarray(model(x, roles=jnp.full_like(x, role)))


def torch_logits(model, batch):
    import torch
    with torch.no_grad():
        return model(torch.tensor(batch)).logits.numpy()


@pytest.fixture(scope="module")
def batch():
    return np.random.RandomState(3).randint(0, 128, (2, 16)).astype(np.int64)


def test_per_role_adapters_load_as_two_peft_adapters_of_one_base(untied_checkpoint, batch,
                                                                 tmp_path):
    import peft
    import transformers

    model = with_adapters(untied_checkpoint.path, "per_role")
    written = peft_io.save_peft_adapters(model, str(tmp_path / "adapters"),
                                         base_model=untied_checkpoint.path)
    assert set(written) == {"planner", "worker"}
    base = transformers.AutoModelForCausalLM.from_pretrained(untied_checkpoint.path).eval()
    peft_model = peft.PeftModel.from_pretrained(base, written["planner"], adapter_name="planner")
    peft_model.load_adapter(written["worker"], adapter_name="worker")
    peft_model.eval()
    for role, name in enumerate(("planner", "worker")):
        peft_model.set_adapter(name)
        expected = torch_logits(peft_model, batch)
        np.testing.assert_allclose(ours(model, batch, role), expected, atol=TOL, rtol=TOL)
    # The two adapters differ, so matching each was not a coincidence of one.
    assert np.abs(ours(model, batch, 0) - ours(model, batch, 1)).max() > 1e-2
    with peft_model.disable_adapter():
        base_logits = torch_logits(peft_model, batch)
    np.testing.assert_allclose(ours(model, batch, lora_lib.ADAPTERS_OFF), base_logits,
                               atol=TOL, rtol=TOL)


def test_shared_adapter_on_some_projections_and_the_merged_weights(untied_checkpoint, batch,
                                                                   tmp_path):
    import peft
    import transformers

    model = with_adapters(untied_checkpoint.path, "shared", targets=("q_proj", "v_proj",
                                                                     "down_proj"))
    written = peft_io.save_peft_adapters(model, str(tmp_path / "adapter"),
                                         base_model=untied_checkpoint.path)
    assert written == {"default": str(tmp_path / "adapter")}
    base = transformers.AutoModelForCausalLM.from_pretrained(untied_checkpoint.path).eval()
    peft_model = peft.PeftModel.from_pretrained(base, written["default"]).eval()
    expected = torch_logits(peft_model, batch)
    np.testing.assert_allclose(ours(model, batch, 0), expected, atol=TOL, rtol=TOL)
    assert np.abs(expected - untied_checkpoint.logits(batch)).max() > 1e-2  # adapters acted
    merged_dir = str(tmp_path / "merged")
    save_params(model.config, peft_io.merged_params(model), merged_dir)
    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    np.testing.assert_allclose(torch_logits(merged, batch), expected, atol=TOL, rtol=TOL)
