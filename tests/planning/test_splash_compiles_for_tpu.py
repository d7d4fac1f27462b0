"""The splash-attention training path (model.attention.train=splash, shared-prompt rule included)
lowered by Mosaic and compiled by libtpu for v5e and v5p slices on this CPU machine: forward and
backward, the batch split over the chips with shard_map (a Pallas call is not partitioned by
XLA), the kernel really in the program, and the per-chip temporaries linear in the length (a
dense [T, T] score tensor alone would be many times the bound)."""
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from matpo_jax.model.splash_attention import splash_packed_attention
from matpo_jax.planning.topology import parse_topology

LENGTH, HEADS, KV_HEADS, HEAD_DIM = 4096, 8, 2, 128


@pytest.mark.parametrize("topology", ["v5e:2x2", "v5p:2x2x1"])
def test_splash_forward_and_backward_compile_for_tpu(topology):
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: pip install -e .[tpu]")
    devices = parse_topology(topology).devices()
    mesh = Mesh(devices, ("data",))
    rows = len(devices)  # one packed row per chip

    def per_chip_loss(q, k, v, segment_ids, prefix_ids):
        out = splash_packed_attention(q, k, v, segment_ids, prefix_ids)
        return jnp.sum(out.astype(jnp.float32) ** 2)[None]

    def loss(q, k, v, segment_ids, prefix_ids):
        # check_vma off: the installed splash kernel declares its outputs without varying axes.
        shard = jax.shard_map(per_chip_loss, mesh=mesh, in_specs=P("data"), out_specs=P("data"),
                              check_vma=False)
        return jnp.sum(shard(q, k, v, segment_ids, prefix_ids))

    batch = NamedSharding(mesh, P("data"))
    shapes = [jax.ShapeDtypeStruct((rows, LENGTH, HEADS, HEAD_DIM), jnp.bfloat16, sharding=batch),
              *[jax.ShapeDtypeStruct((rows, LENGTH, KV_HEADS, HEAD_DIM), jnp.bfloat16,
                                     sharding=batch)] * 2,
              *[jax.ShapeDtypeStruct((rows, LENGTH), jnp.int32, sharding=batch)] * 2]
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*shapes).compile()
    assert "tpu_custom_call" in compiled.as_text()
    temporaries = compiled.memory_analysis().temp_size_in_bytes
    dense_scores = HEADS * LENGTH * LENGTH * 4  # one row's float32 scores: 512 MiB
    assert temporaries < dense_scores / 8, temporaries
