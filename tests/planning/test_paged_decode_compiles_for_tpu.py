"""The paged decode attention (model/paged_attention.py) lowered by Mosaic and compiled by libtpu
for a v5e and a v5p chip at the paper's decode shape (Qwen3-4B's heads, a 40,960-token table, 64
rows): the kernel is really in the program, and the page pool it reads is the cache's whole
memory, sized by the tokens in flight rather than rows x max context."""
import jax
import jax.numpy as jnp
import pytest

from matpo_jax.model.paged_attention import tpu_paged_decode_attention
from matpo_jax.planning.topology import parse_topology

ROWS, HEADS, KV_HEADS, HEAD_DIM = 64, 32, 8, 128
MAX_LEN, PAGE = 40960, 64
# A pool for 64 rows at a mean fill of 4,096 tokens: a tenth of the dense rows x max context.
NUM_PAGES = ROWS * 4096 // PAGE


@pytest.mark.parametrize("topology", ["v5e:1x1", "v5p:1x1x1"])
def test_paged_decode_attention_compiles_for_tpu(topology):
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: pip install -e .[tpu]")
    device = parse_topology(topology).devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    shapes = [jax.ShapeDtypeStruct((ROWS, HEADS, HEAD_DIM), jnp.bfloat16, sharding=sharding),
              *[jax.ShapeDtypeStruct((KV_HEADS, NUM_PAGES, PAGE, HEAD_DIM), jnp.bfloat16,
                                     sharding=sharding)] * 2,
              jax.ShapeDtypeStruct((ROWS, MAX_LEN // PAGE), jnp.int32, sharding=sharding),
              jax.ShapeDtypeStruct((ROWS,), jnp.int32, sharding=sharding)]
    compiled = jax.jit(tpu_paged_decode_attention).lower(*shapes).compile()
    assert "tpu_custom_call" in compiled.as_text()
    memory = compiled.memory_analysis()
    pool = 2 * KV_HEADS * NUM_PAGES * PAGE * HEAD_DIM * 2  # K and V, bfloat16
    dense = 2 * ROWS * KV_HEADS * MAX_LEN * HEAD_DIM * 2
    assert memory.argument_size_in_bytes < pool * 1.01 and pool * 10 == dense
    # The kernel streams pages through VMEM: no temporary the size of a row's gathered keys.
    assert memory.temp_size_in_bytes < ROWS * KV_HEADS * MAX_LEN * HEAD_DIM * 2 / 8


@pytest.mark.parametrize("topology", ["v5e:1x1", "v5p:1x1x1"])
def test_paged_extend_kernel_compiles_for_tpu(topology):
    """Our multi-token extend kernel (model/paged_extend_kernel.py) at an injection's shape: 16
    lanes writing a 512-token chunk into 40,960-token tables, Qwen3-4B's heads. It streams a
    row's pages through VMEM: its temporaries are the regrouped queries and the output (64 MiB),
    where XLA's reference gathers every table entry into dense rows (it needs 43 GiB on v5e,
    which does not compile)."""
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: pip install -e .[tpu]")
    from matpo_jax.model.paged_extend_kernel import tpu_paged_extend_attention
    lanes, chunk = 16, 512
    device = parse_topology(topology).devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    pages = lanes * 4096 // PAGE

    def shape(dims, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(dims, dtype, sharding=sharding)
    compiled = jax.jit(tpu_paged_extend_attention).lower(
        shape((lanes, chunk, HEADS, HEAD_DIM), jnp.bfloat16),
        *[shape((KV_HEADS, pages, PAGE, HEAD_DIM), jnp.bfloat16)] * 2,
        shape((lanes, MAX_LEN // PAGE)), shape((lanes,)), shape((lanes, chunk))).compile()
    assert "tpu_custom_call" in compiled.as_text()
    queries = lanes * chunk * HEADS * HEAD_DIM * 2
    gathered_rows = 2 * lanes * KV_HEADS * MAX_LEN * HEAD_DIM * 2  # K and V, 2.5 GiB
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp <= 2 * queries and temp < gathered_rows / 32
