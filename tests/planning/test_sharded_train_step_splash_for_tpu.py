"""The whole RL train step (make_train_step: loss, backward, AdamW, sharded state) of a small
Qwen3-shaped model with model.attention.train=splash, compiled by libtpu for multi-chip v5e and
v5p slices on this CPU machine: XLA does not partition a Pallas call, so this compiles only with
the kernel under shard_map; the splash kernels are in the program, each at one chip's share of
the rows and kv heads; and `auto` resolves to splash because the mesh's devices are TPUs."""
import dataclasses
import re

import pytest

from matpo_jax import parallel
from matpo_jax.model import DecoderConfig, attention_dispatch
from matpo_jax.planning import step_plan
from matpo_jax.planning.topology import parse_topology
from matpo_jax.trainer import step as ts
from fixtures.losses import default_loss

ROWS_PER_CHIP, LENGTH = 2, 1024
QWEN3_SHAPED = DecoderConfig(vocab_size=1024, hidden_size=256, intermediate_size=512,
                             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                             head_dim=128, dtype="bfloat16")


def compile_train_step(topology: str, mesh_shape: dict, choice: str):
    devices = parse_topology(topology).devices()
    mesh = parallel.make_mesh(mesh_shape, devices=devices)
    model = dataclasses.replace(QWEN3_SHAPED, attention_train=choice)
    graphdef, params, frozen = step_plan.abstract_model(model)
    tx = ts.make_optimizer(ts.OptimizerConfig())
    state, shardings = step_plan.abstract_train_state(params, frozen, tx, mesh)
    rows = ROWS_PER_CHIP * mesh.shape["data"] * mesh.shape["fsdp"]
    batch = step_plan.abstract_batch(rows, LENGTH, mesh, with_ref_logprobs=False)
    # Shared prompts too: the two merged kernel calls and their custom backward, per shard.
    batch = dataclasses.replace(batch, prefix_ids=batch.segment_ids)
    config = ts.TrainStepConfig(loss=default_loss(), remat="full", scan_layers=True)
    run = ts.make_train_step(graphdef, tx, config, mesh, shardings)
    with attention_dispatch.record() as uses:
        lowered = run.jitted.lower(state, batch)
    return mesh, uses, lowered.compile().as_text()


@pytest.mark.parametrize("topology, mesh_shape, choice", [
    ("v5e:2x2", dict(data=1, fsdp=2, tensor=2), "splash"),  # rows over 2 chips, kv heads over 2
    ("v5p:2x2x1", dict(data=2, fsdp=2, tensor=1), "auto"),  # rows over 4 chips, heads whole
])
def test_the_sharded_train_step_compiles_with_splash_per_chip(topology, mesh_shape, choice):
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: pip install -e .[tpu]")
    mesh, uses, text = compile_train_step(topology, mesh_shape, choice)
    rows, kv_heads = ROWS_PER_CHIP, QWEN3_SHAPED.num_key_value_heads // mesh.shape["tensor"]
    group = QWEN3_SHAPED.num_attention_heads // QWEN3_SHAPED.num_key_value_heads
    assert {(u.path, u.implementation, u.interpret, u.sharded) for u in uses} == {
        ("train", "splash", False, True)}
    assert {u.query_shape for u in uses} == {(rows, LENGTH, kv_heads * group, 128)}
    # Mosaic kernels in the compiled program: the forward (with its log-sum-exp residuals for
    # the merged prompt rule) and the dq / dkv backward, each over one chip's [rows, kv heads,
    # group, T, D] block of queries.
    calls = [line for line in text.splitlines() if "custom-call(" in line
             and "tpu_custom_call" in line and "%splash_mqa_" in line]
    names = {re.search(r"%(splash_mqa_\w+?)(\.\d+)? =", line).group(1) for line in calls}
    assert {"splash_mqa_fwd_segmented_residuals", "splash_mqa_dq_segmented_no_residuals",
            "splash_mqa_dkv_segmented_no_residuals"} <= names, names
    per_chip_queries = f"bf16[{rows},{kv_heads},{group},{LENGTH},128]"
    assert all(per_chip_queries in line for line in calls if "fwd" in line or "dq" in line)
