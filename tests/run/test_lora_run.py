"""A whole tiny run with per-role LoRA adapters (model.lora.*): SFT, RL with the KL term (its
reference = the base with adapters off), evaluation; checkpoints hold the adapters alone plus
the base's identity; a run resumed mid-RL ends with the adapters of an uninterrupted one, bit
for bit; adapters are refused over another base."""
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from matpo_jax.config import apply_overrides, to_typed
from matpo_jax.config.files import load_config_file
from matpo_jax.run import provenance
from matpo_jax.trainer import checkpoint as ckpt_lib
from test_end_to_end import TINY, shrink

LORA = "model.lora.rank=4,model.lora.alpha=8.0,model.lora.roles=per_role,rl.kl_coef=0.05"


def overrides(data_dir: str, rl_steps: int) -> str:
    """The end-to-end tests' tiny run, with per-role LoRA (3 SFT steps: no copy rehearsal)."""
    return (shrink(data_dir, rl_steps) + ",sft.steps=3,sft.lr=3e-3,rl.lr=3e-3,"
            "eval.num_questions=2," + LORA)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds"))


def run(workdir: str, data_dir: str, rl_steps: int, **kwargs) -> dict:
    from matpo_jax.run.experiment import run_experiment
    cfg = to_typed(load_config_file(TINY, overrides(data_dir, rl_steps)))
    return run_experiment(cfg, workdir, **kwargs)


def rl_adapters(workdir: str):
    directory = os.path.join(workdir, "checkpoints", "rl")
    with ckpt_lib.Checkpointer(directory) as c:
        step = c.latest_step()
    return step, ocp.StandardCheckpointer().restore(os.path.join(directory, str(step), "params"))


def leaves_with_paths(tree):
    return [(jax.tree_util.keystr(path), np.asarray(leaf))
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_dir):
    workdir = str(tmp_path_factory.mktemp("straight"))
    return workdir, run(workdir, data_dir, rl_steps=2)


def test_checkpoints_hold_the_adapters_alone_and_the_bases_identity(straight):
    workdir, summary = straight
    assert summary
    step, params = rl_adapters(workdir)
    leaves = leaves_with_paths(params)
    assert step == 2 and leaves
    assert all("lora_a" in path or "lora_b" in path for path, _ in leaves)
    assert all(leaf.shape[0] == 2 for _, leaf in leaves)  # planner and worker adapters
    identity = provenance.read_identity(os.path.join(workdir, "checkpoints", "rl"), step)
    base = identity[provenance.BASE_KEY]
    assert base["path"] is None and len(base["sha256"]) == 64  # a base built from model.arch
    # Both adapters trained (B left zero), and the worker's by worker tokens alone.
    lora_b = [leaf for path, leaf in leaves if "lora_b" in path]
    assert all(np.abs(b[0]).max() > 0 and np.abs(b[1]).max() > 0 for b in lora_b)


def test_resumed_lora_run_ends_with_the_adapters_of_the_uninterrupted_one(straight, tmp_path,
                                                                          data_dir):
    workdir = str(tmp_path / "resumed")
    run(workdir, data_dir, rl_steps=1)  # stops after RL step 1, as a killed run would
    run(workdir, data_dir, rl_steps=2, allow_config_change="train.steps")
    step_a, a = rl_adapters(straight[0])
    step_b, b = rl_adapters(workdir)
    assert step_a == step_b == 2
    for (path_a, x), (path_b, y) in zip(leaves_with_paths(a), leaves_with_paths(b), strict=True):
        assert path_a == path_b
        np.testing.assert_array_equal(x, y, err_msg=path_a)


def test_adapters_are_refused_over_another_base(straight, data_dir):
    workdir, _ = straight
    step, _ = rl_adapters(workdir)
    identity = provenance.read_identity(os.path.join(workdir, "checkpoints", "rl"), step)
    ours = to_typed(load_config_file(TINY, overrides(data_dir, 2)))
    provenance.check_base(identity, provenance.base_identity(ours), checkpoint="rl")  # same base
    other = to_typed(apply_overrides(load_config_file(TINY, overrides(data_dir, 2)),
                                     "train.seed=7"))  # another random base
    with pytest.raises(provenance.ArtifactMismatch, match="LoRA adapters of another base"):
        provenance.check_base(identity, provenance.base_identity(other), checkpoint="rl")


def test_export_writes_the_base_and_two_peft_adapters_that_peft_loads(straight, tmp_path,
                                                                      data_dir):
    import jax.numpy as jnp
    import peft
    import torch
    import transformers

    from matpo_jax.parallel import make_mesh
    from matpo_jax.run.eval.job import CheckpointSource, restore_source
    from matpo_jax.run.export import export_checkpoint
    from flax import nnx

    workdir, _ = straight
    checkpoint = os.path.join(workdir, "checkpoints", "rl")
    out = str(tmp_path / "export")
    exported = export_checkpoint(checkpoint, out)
    assert exported.step == 2
    for role in ("planner", "worker"):
        assert os.path.isfile(os.path.join(out, "adapters", role, "adapter_model.safetensors"))
    # Ours: the run's model restored the way evaluation restores it (build_model + adapters).
    cfg = to_typed(load_config_file(TINY, overrides(data_dir, 2)))  # the run's own config
    graphdef, state, _ = restore_source(cfg, make_mesh(devices=jax.devices()[:1]),
                                        CheckpointSource(checkpoint, None))
    model = nnx.merge(graphdef, state)
    batch = np.random.RandomState(0).randint(0, 200, (1, 12))
    base = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        base_logits = base(torch.tensor(batch)).logits.numpy()
    torch_model = peft.PeftModel.from_pretrained(base, os.path.join(out, "adapters", "planner"),
                                                 adapter_name="planner")
    torch_model.load_adapter(os.path.join(out, "adapters", "worker"), adapter_name="worker")
    x = jnp.asarray(batch)
    for role, name in enumerate(("planner", "worker")):
        torch_model.set_adapter(name)
        with torch.no_grad():
            theirs = torch_model(torch.tensor(batch)).logits.numpy()
        np.testing.assert_allclose(np.asarray(model(x, roles=jnp.full_like(x, role))), theirs,
                                   atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(model(x, roles=jnp.full_like(x, -1))), base_logits,
                               atol=1e-4, rtol=1e-4)
