"""The blocked (online-softmax) cache attention of multi-token extends equals the dense one."""
import jax
import jax.numpy as jnp
import numpy as np

from matpo_jax.model.decoder import blocked_cached_attention, cached_attention


def test_blocked_cache_attention_matches_dense_mask():
    batch, q_len, heads, kv_heads, head_dim, max_len = 3, 6, 4, 2, 8, 23
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (batch, q_len, heads, head_dim))
    k = jax.random.normal(keys[1], (batch, kv_heads, max_len, head_dim))
    v = jax.random.normal(keys[2], (batch, kv_heads, max_len, head_dim))
    # Row 0 fills the cache (the last, shifted block matters), row 1 is short, row 2 mid-way.
    start = jnp.array([17, 0, 9])
    num_valid = jnp.array([6, 4, 6])
    positions = start[:, None] + jnp.arange(q_len)[None]
    lengths = start + num_valid
    slots = jnp.arange(max_len)[None, None]
    mask = (slots <= positions[:, :, None]) & (slots < lengths[:, None, None])
    k = k.transpose(0, 1, 3, 2)  # the cache's slot-minor key layout [B, K, D, S]
    dense = cached_attention(q, k, v, mask)
    for block in (5, 8, 23, 128):  # several blocks, a partial last one, one block, S < block
        blocked = blocked_cached_attention(q, k, v, positions, lengths, block=block)
        valid = np.arange(q_len)[None] < np.asarray(num_valid)[:, None]  # padding rows: ignored
        np.testing.assert_allclose(np.asarray(blocked)[valid], np.asarray(dense)[valid],
                                   atol=1e-5, rtol=1e-5)
