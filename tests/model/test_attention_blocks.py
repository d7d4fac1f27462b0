"""The block-causal packed training attention equals the dense masked attention (values and
gradients) on random packings: segment boundaries inside and across blocks, padding, GQA, and
block sizes that do not divide the length."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from matpo_jax.model.decoder import grouped_attention, packed_attention


def dense_packed(q, k, v, segment_ids, prefix_ids=None):
    """The pre-blockwise training path: a dense [B, T, T] causal-and-same-segment mask (or the
    segment's shared prefix)."""
    length = q.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    visible = segment_ids[:, :, None] == segment_ids[:, None, :]
    if prefix_ids is not None:
        visible |= (prefix_ids[:, :, None] == segment_ids[:, None, :]) & (prefix_ids > 0)[:, :, None]
    mask = causal[None] & visible & (segment_ids != 0)[:, :, None]
    return grouped_attention(q, k, v, mask)


def random_segments(rng, batch, length, max_segment):
    """Rows of consecutive segments of random lengths (ids increasing from a random start), with
    random-length padding (segment 0) at the end and, in one row, a padding gap mid-row."""
    seg = np.zeros((batch, length), np.int32)
    for b in range(batch):
        pos, sid = 0, int(rng.integers(1, 5))
        end = length - int(rng.integers(0, length // 4))
        while pos < end:
            n = int(rng.integers(1, max_segment))
            seg[b, pos:min(pos + n, end)] = sid
            pos, sid = pos + n, sid + 1
    seg[0, length // 3: length // 3 + 5] = 0
    return seg


@pytest.mark.parametrize("length,block,heads,kv_heads", [
    (64, 16, 4, 2), (61, 16, 4, 2), (50, 64, 2, 2), (96, 32, 6, 2), (40, 7, 4, 1)])
def test_blockwise_equals_dense(length, block, heads, kv_heads):
    rng = np.random.default_rng(length + block)
    batch, head_dim = 3, 8
    q = jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((batch, length, kv_heads, head_dim)), jnp.float32)
            for _ in range(2))
    seg = jnp.asarray(random_segments(rng, batch, length, max_segment=block + 5))
    cot = jnp.asarray(rng.standard_normal((batch, length, heads * head_dim)), jnp.float32)

    def run(fn):
        out, vjp = jax.vjp(lambda a, b, c: fn(a, b, c), q, k, v)
        return (out, *vjp(cot))

    dense = jax.jit(lambda: run(lambda a, b, c: dense_packed(a, b, c, seg)))()
    blocked = jax.jit(lambda: run(lambda a, b, c: packed_attention(a, b, c, seg, block=block)))()
    for name, got, want in zip(["out", "dq", "dk", "dv"], blocked, dense):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5,
                                   err_msg=name)
    assert np.isfinite(np.asarray(blocked[0])).all()


def test_blockwise_bfloat16_close_to_dense():
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 48, 4, 16)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((2, 48, 2, 16)), jnp.bfloat16) for _ in range(2))
    seg = jnp.asarray(random_segments(rng, 2, 48, max_segment=20))
    got = packed_attention(q, k, v, seg, block=16)
    want = dense_packed(q, k, v, seg)
    assert got.dtype == want.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               atol=3e-2)


def test_key_block_starts_on_a_known_layout():
    """Block b starts at the key block of the earliest first position of its queries' segment
    ids over all rows; padding queries do not hold a block back, no block starts past its
    diagonal, and ids that cannot be first-position-indexed switch the skip off."""
    from matpo_jax.model.packed_attention import key_block_starts
    seg = jnp.asarray([[1, 1, 1, 2, 2, 2, 3, 3],
                       [1, 1, 2, 2, 2, 2, 0, 0]])
    # block 2 (positions 4, 5): segment 2 starts at 3 (row 0) and 2 (row 1): key block 1.
    # block 3: segment 3 starts at 6; row 1 is padding there.
    np.testing.assert_array_equal(key_block_starts(seg, 2), [0, 0, 1, 3])
    only_padding_late = jnp.asarray([[1, 1, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(key_block_starts(only_padding_late, 2), [0, 0, 2, 3])
    # An id reused after another segment: its first position (0) bounds the block.
    reused = jnp.asarray([[1, 1, 2, 2, 2, 2, 1, 1]])
    np.testing.assert_array_equal(key_block_starts(reused, 2), [0, 1, 1, 0])
    np.testing.assert_array_equal(key_block_starts(jnp.asarray([[1, 1, 9, 9]]), 2), [0, 0])
    np.testing.assert_array_equal(key_block_starts(jnp.asarray([[1, 1, -2, -2]]), 2), [0, 0])


def test_skipping_masked_key_blocks_changes_no_bit(monkeypatch):
    """The loops start at `key_block_starts` instead of key block 0: outputs at non-padding
    positions and all three gradients are bitwise those of the loops that visit every key
    block up to the diagonal (what is skipped adds exact zeros), on layouts where blocks do
    start late: long segments, padding at row ends and a reused id."""
    from matpo_jax.model import packed_attention as attention
    rng = np.random.default_rng(7)
    batch, length, block, heads, kv_heads, head_dim = 2, 96, 16, 4, 2, 8
    seg = np.zeros((batch, length), np.int32)
    seg[0, :40], seg[0, 40:90] = 1, 2
    seg[1, :20], seg[1, 20:64], seg[1, 64:80], seg[1, 80:] = 1, 2, 3, 1
    seg = jnp.asarray(seg)
    assert int(attention.key_block_starts(seg, block).max()) > 0
    q = jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((batch, length, kv_heads, head_dim)), jnp.float32)
            for _ in range(2))
    # The loss ignores padding outputs, as the train step's does.
    cot = jnp.asarray(rng.standard_normal((batch, length, heads * head_dim)), jnp.float32)
    cot = cot * (seg != 0)[..., None]

    def traced():
        """A new function each time: jit would reuse the first trace for the same one."""
        def run():
            out, vjp = jax.vjp(lambda a, b, c: packed_attention(a, b, c, seg, block=block),
                               q, k, v)
            return (jnp.where((seg != 0)[..., None], out, 0.0), *vjp(cot))
        return jax.jit(run)()

    skipping = traced()
    calls = []

    def every_key_block(segment_ids, block, prefix_ids=None):
        calls.append(block)
        return jnp.zeros(segment_ids.shape[1] // block, jnp.int32)

    monkeypatch.setattr(attention, "key_block_starts", every_key_block)
    every_block = traced()
    assert calls  # the loops without the skip were traced
    for name, got, want in zip(["out", "dq", "dk", "dv"], skipping, every_block):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=name)


def shared_prefix_rows(rng, batch, length):
    """Rows of shared prompts (a prefix segment, then 1-4 segments continuing it), plain
    segments and padding, with lengths that cross block boundaries."""
    seg = np.zeros((batch, length), np.int32)
    pre = np.zeros((batch, length), np.int32)
    for b in range(batch):
        pos, sid = 0, 1
        end = length - int(rng.integers(0, 12))
        while pos < end:
            n = min(int(rng.integers(3, 30)), end - pos)
            seg[b, pos:pos + n], prefix = sid, sid
            pos, sid = pos + n, sid + 1
            if rng.random() < 0.7:  # a shared prompt: its continuations follow
                for _ in range(int(rng.integers(1, 5))):
                    if pos >= end:
                        break
                    n = min(int(rng.integers(1, 20)), end - pos)
                    seg[b, pos:pos + n], pre[b, pos:pos + n] = sid, prefix
                    pos, sid = pos + n, sid + 1
    return seg, pre


@pytest.mark.parametrize("length,block", [(96, 16), (80, 32), (70, 16)])
def test_shared_prefixes_blockwise_equal_dense(length, block):
    """Segments continuing a shared prefix attend it (and not each other), blockwise as dense:
    values and all three gradients."""
    rng = np.random.default_rng(length + block)
    batch, heads, kv_heads, head_dim = 3, 4, 2, 8
    q = jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((batch, length, kv_heads, head_dim)), jnp.float32)
            for _ in range(2))
    seg, pre = (jnp.asarray(x) for x in shared_prefix_rows(rng, batch, length))
    assert int((pre > 0).sum()) > 0
    cot = jnp.asarray(rng.standard_normal((batch, length, heads * head_dim)), jnp.float32)

    def run(fn):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(cot))

    dense = jax.jit(lambda: run(lambda a, b, c: dense_packed(a, b, c, seg, pre)))()
    blocked = jax.jit(lambda: run(
        lambda a, b, c: packed_attention(a, b, c, seg, block=block, prefix_ids=pre)))()
    for name, got, want in zip(["out", "dq", "dk", "dv"], blocked, dense):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5,
                                   err_msg=name)
