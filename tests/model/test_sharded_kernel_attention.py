"""model.attention.train=splash in a train step sharded over 8 simulated CPU devices: the kernel
(Pallas interpret mode) runs per shard under shard_map, each device on its own rows and heads,
and the loss and every gradient equal the xla reference's on the same mesh; with shared prompts
(prefix_ids) and with heads that do not divide the tensor axis (then replicated)."""
import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from matpo_jax import parallel
from matpo_jax.model import CausalLM, DecoderConfig, attention_dispatch
from matpo_jax.model.kernel_sharding import shard_specs
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as ts
from fixtures.losses import default_loss

VOCAB, ROW_LEN = 64, 96


def shared_prompt_sequences(seed=0):
    """Two prompts, each continued by four sampled answers: packed with share_prompts, the rows
    hold each prompt once and carry prefix_ids."""
    rng = np.random.default_rng(seed)
    seqs = []
    for prompt_len in (20, 26):
        prompt = rng.integers(1, VOCAB, prompt_len)
        for _ in range(4):
            tokens = np.concatenate([prompt, rng.integers(1, VOCAB, int(rng.integers(5, 30)))])
            trainable = np.arange(len(tokens)) >= prompt_len
            seqs.append(packing.TrainSequence(
                tokens=tokens.astype(np.int32), trainable=trainable,
                old_logprobs=np.where(trainable, -rng.uniform(0.1, 3, len(tokens)), 0).astype(
                    np.float32),
                advantage=float(rng.normal()), role_id=0, rollout_id=len(seqs),
                group_id=len(seqs)))
    return seqs


def gradients(choice, kv_heads, mesh, batch, config):
    model_config = DecoderConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=kv_heads, head_dim=8,
                                 attention_train=choice)
    model = CausalLM(model_config, rngs=nnx.Rngs(0))
    graphdef, state, shardings = ts.init_train_state(model, optax.sgd(0.1), mesh)
    with attention_dispatch.record() as uses:
        loss, grads, _ = ts.make_gradient_fn(graphdef, config, mesh, shardings)(state, batch)
    return loss, grads, uses


@pytest.mark.parametrize("kv_heads, shard_heads", [(2, 2), (1, 4)])
def test_splash_per_shard_gives_the_reference_loss_and_gradients(make_mesh, kv_heads,
                                                                  shard_heads):
    mesh = make_mesh(2, 2, 2)  # rows over data x fsdp = 4, heads over tensor = 2
    config = ts.TrainStepConfig(loss=default_loss())
    batch = packing.pack_sequences(shared_prompt_sequences(), ROW_LEN,
                                   row_multiple=config.row_multiple(mesh),
                                   loss_config=config.loss, share_prompts=True)
    assert batch.prefix_ids is not None and batch.shape == (4, ROW_LEN)

    loss, grads, uses = gradients("xla", kv_heads, mesh, batch, config)
    assert {u.implementation for u in uses} == {"xla"}
    splash_loss, splash_grads, uses = gradients("splash", kv_heads, mesh, batch, config)
    # The kernel ran under shard_map: one row of the four per device, and its share of the heads
    # (all 4 when 1 kv head cannot be split over tensor = 2).
    assert {(u.implementation, u.interpret, u.sharded) for u in uses} == {("splash", True, True)}
    assert {u.query_shape for u in uses} == {(1, ROW_LEN, shard_heads, 8)}
    np.testing.assert_allclose(float(splash_loss), float(loss), rtol=1e-5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(splash_grads),
                            jax.tree.leaves(grads)):
        scale = float(np.abs(b).max())
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5 * scale,
                                   err_msg=jax.tree_util.keystr(path))


def test_shard_specs_split_what_divides_and_replicate_the_rest(make_mesh):
    mesh = make_mesh(2, 2, 2)
    rows = ("data", "fsdp")
    assert shard_specs(mesh, 4, 8, 2) == (P(rows, None, "tensor", None), P(rows, None))
    # 8 query heads over 1 kv head: a chip must hold a whole group, so heads stay whole.
    assert shard_specs(mesh, 4, 8, 1) == (P(rows, None, None, None), P(rows, None))
    assert shard_specs(mesh, 2, 8, 2) == (P(None, None, "tensor", None), P(None, None))
    # Axes of size 1 are not named (the per-shard shapes are the same either way).
    assert shard_specs(make_mesh(1, 8, 1), 8, 4, 2) == (P(("fsdp",), None, None, None),
                                                         P(("fsdp",), None))


def test_on_one_device_the_kernel_is_not_wrapped():
    config = ts.TrainStepConfig(loss=default_loss())
    batch = packing.pack_sequences(shared_prompt_sequences(1)[:3], ROW_LEN, row_multiple=1,
                                   loss_config=config.loss, share_prompts=True)
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    _, _, uses = gradients("splash", 2, mesh, batch, config)
    assert uses and not any(u.sharded for u in uses)
    assert {u.query_shape[0] for u in uses} == {batch.shape[0]}
