"""The paged KV cache (paged_cache.py) against the dense one: the same tokens written in ragged
steps that cross page boundaries, into pages taken from a shuffled free stack, give the dense
cache's attention; pages follow the tokens (allocation, release, reference counts); a shared
prompt prefix reads like the row's own copy and is never written through; running out of pages
is flagged and corrupts no other row. And the TPU paged-attention kernels (decode, and our
multi-token extend) in Pallas interpret mode equal the reference on ragged rows."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from matpo_jax.model import paged_cache as pc
from matpo_jax.model.cached_attention import cached_attention
from matpo_jax.model.paged_attention import (SMEM_TABLE_BYTES, gpu_paged_decode_attention,
                                             pages_per_compute_block, rows_per_call,
                                             tpu_paged_decode_attention)
from matpo_jax.model.paged_extend_kernel import tpu_paged_extend_attention

KV_HEADS, GROUP, HEAD_DIM, PAGE = 2, 3, 8, 4
HEADS = KV_HEADS * GROUP


def shuffled_free_stack(cache, seed=0):
    """Pages handed out in a random order, so a row's pages are not contiguous."""
    order = np.random.default_rng(seed).permutation(cache.num_pages).astype(np.int32)
    return cache._replace(free=jnp.asarray(order))


def write_step(cache, lengths_now, k_new, v_new, num):
    """Appends num[b] tokens of k_new/v_new [B, T, K, D] to each row, in every layer."""
    new_lengths = lengths_now + num
    cache = pc.reserve(cache, new_lengths)
    positions = lengths_now[:, None] + jnp.arange(k_new.shape[1], dtype=jnp.int32)[None, :]
    layers = [pc.write(k, v, cache.page_table, positions, k_new, v_new, num)
              for k, v in zip(cache.k, cache.v)]
    cache = cache._replace(k=tuple(k for k, _ in layers), v=tuple(v for _, v in layers))
    return pc.advance(cache, new_lengths)


def dense_from_tokens(keys, values, lengths, max_len):
    """The dense cache's layout [B, K, D, S] / [B, K, S, D] of each row's first lengths[b] tokens
    (keys/values [B, S, K, D])."""
    k = np.zeros((keys.shape[0], KV_HEADS, HEAD_DIM, max_len), np.float32)
    v = np.zeros((keys.shape[0], KV_HEADS, max_len, HEAD_DIM), np.float32)
    for b, n in enumerate(lengths):
        k[b, :, :, :n] = np.transpose(keys[b, :n], (1, 2, 0))
        v[b, :, :n, :] = np.transpose(values[b, :n], (1, 0, 2))
    return jnp.asarray(k), jnp.asarray(v)


def fill(rows=3, max_len=32, num_pages=24, steps=((3, 0, 5), (1, 4, 4), (6, 1, 0), (1, 1, 9)),
         seed=0):
    """A cache filled by ragged steps (tokens per row per step), and the tokens it holds."""
    rng = np.random.default_rng(seed)
    cache = shuffled_free_stack(pc.init_paged_cache(2, KV_HEADS, HEAD_DIM, rows, max_len,
                                                    num_pages, PAGE), seed)
    keys = np.zeros((rows, max_len, KV_HEADS, HEAD_DIM), np.float32)
    values = np.zeros_like(keys)
    lengths = np.zeros(rows, np.int32)
    for num in steps:
        width = max(num)
        k_new = rng.normal(size=(rows, width, KV_HEADS, HEAD_DIM)).astype(np.float32)
        v_new = rng.normal(size=(rows, width, KV_HEADS, HEAD_DIM)).astype(np.float32)
        cache = write_step(cache, jnp.asarray(lengths), jnp.asarray(k_new), jnp.asarray(v_new),
                           jnp.asarray(num, jnp.int32))
        for b, n in enumerate(num):
            keys[b, lengths[b]:lengths[b] + n] = k_new[b, :n]
            values[b, lengths[b]:lengths[b] + n] = v_new[b, :n]
        lengths += np.asarray(num)
    return cache, keys, values, lengths


def decode_query(rows, seed=1):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(rows, 1, HEADS, HEAD_DIM)),
                       jnp.float32)


def test_ragged_writes_across_pages_attend_like_the_dense_cache():
    cache, keys, values, lengths = fill()
    np.testing.assert_array_equal(cache.lengths, lengths)  # 11, 6, 18
    assert not bool(cache.overflow)
    q = decode_query(3)
    positions = jnp.asarray(lengths - 1)[:, None]
    for layer in range(2):
        k_dense, v_dense = dense_from_tokens(keys, values, lengths, cache.max_len)
        mask = jnp.arange(cache.max_len)[None, None, :] < jnp.asarray(lengths)[:, None, None]
        expected = cached_attention(q, k_dense, v_dense, mask)
        got = pc.paged_attention_reference(q, cache.k[layer], cache.v[layer], cache.page_table,
                                           cache.lengths, positions)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # A multi-token extend's causal mask: query t sees positions <= its own.
    q3 = jnp.asarray(np.random.default_rng(2).normal(size=(3, 3, HEADS, HEAD_DIM)), jnp.float32)
    pos3 = jnp.asarray(lengths - 3)[:, None] + jnp.arange(3)[None, :]
    k_dense, v_dense = dense_from_tokens(keys, values, lengths, cache.max_len)
    slots = jnp.arange(cache.max_len)[None, None, :]
    mask = (slots <= pos3[:, :, None]) & (slots < jnp.asarray(lengths)[:, None, None])
    np.testing.assert_allclose(
        pc.paged_attention_reference(q3, cache.k[1], cache.v[1], cache.page_table, cache.lengths,
                                     pos3),
        cached_attention(q3, k_dense, v_dense, mask), rtol=1e-5, atol=1e-6)


def test_pages_follow_the_tokens_and_come_back_on_release():
    cache, _, _, lengths = fill()
    per_row = -(-lengths // PAGE)  # 3, 2, 5 pages
    assert int(pc.pages_in_use(cache)) == per_row.sum()
    mapped = np.asarray(cache.page_table)
    held = mapped[mapped < cache.num_pages]
    assert len(set(held.tolist())) == len(held)  # no page in two rows
    np.testing.assert_array_equal(np.asarray(cache.refcount)[held], 1)
    cache = pc.release(cache, jnp.asarray([False, True, False]))
    assert int(pc.pages_in_use(cache)) == per_row[0] + per_row[2]
    assert int(cache.lengths[1]) == 0 and np.all(np.asarray(cache.page_table[1]) == cache.num_pages)
    # The freed pages are the next ones handed out.
    freed = set(mapped[1][mapped[1] < cache.num_pages].tolist())
    cache = pc.reserve(cache, cache.lengths.at[1].set(2 * PAGE))
    assert set(np.asarray(cache.page_table[1, :2]).tolist()) == freed
    cache = pc.release(cache, jnp.asarray([True, True, True]))
    assert int(cache.num_free) == cache.num_pages
    assert sorted(np.asarray(cache.free).tolist()) == list(range(cache.num_pages))
    assert not np.any(np.asarray(cache.refcount))


def test_a_shared_prefix_reads_like_its_own_copy_and_is_never_written_through():
    cache, keys, values, lengths = fill()
    prefix = 10  # two full pages shared, the third (2 of 4 tokens) copied
    # Row 1 (6 tokens of its own) restarts from row 0's prefix: its own pages go back first.
    cache = pc.share_pages(cache, cache.page_table[:1], jnp.asarray([1]), jnp.asarray([prefix]))
    assert int(pc.pages_in_use(cache)) == 3 + 1 + 5
    table = np.asarray(cache.page_table)
    np.testing.assert_array_equal(table[1, :2], table[0, :2])
    assert table[1, 2] != table[0, 2] and table[1, 3] == cache.num_pages
    np.testing.assert_array_equal(np.asarray(cache.refcount)[table[0, :2]], 2)
    assert int(cache.lengths[1]) == prefix
    # Row 1 continues with its own tokens; row 0 is untouched.
    rng = np.random.default_rng(5)
    k_new = rng.normal(size=(3, 3, KV_HEADS, HEAD_DIM)).astype(np.float32)
    v_new = rng.normal(size=(3, 3, KV_HEADS, HEAD_DIM)).astype(np.float32)
    before_row0 = [np.asarray(k[:, table[0, :3]]) for k in cache.k]
    cache = write_step(cache, cache.lengths, jnp.asarray(k_new), jnp.asarray(v_new),
                       jnp.asarray([0, 3, 0], jnp.int32))
    for layer, k in enumerate(cache.k):
        np.testing.assert_array_equal(np.asarray(k[:, table[0, :3]]), before_row0[layer])
    own_keys = keys.copy()
    own_values = values.copy()
    own_keys[1, :prefix], own_values[1, :prefix] = keys[0, :prefix], values[0, :prefix]
    own_keys[1, prefix:prefix + 3], own_values[1, prefix:prefix + 3] = k_new[1], v_new[1]
    own_lengths = np.array([lengths[0], prefix + 3, lengths[2]])
    q = decode_query(3, seed=7)
    k_dense, v_dense = dense_from_tokens(own_keys, own_values, own_lengths, cache.max_len)
    mask = jnp.arange(cache.max_len)[None, None, :] < jnp.asarray(own_lengths)[:, None, None]
    np.testing.assert_allclose(
        pc.paged_attention_reference(q, cache.k[0], cache.v[0], cache.page_table, cache.lengths,
                                     jnp.asarray(own_lengths - 1)[:, None]),
        cached_attention(q, k_dense, v_dense, mask), rtol=1e-5, atol=1e-6)
    # The shared pages stay until the last table lets them go.
    cache = pc.release(cache, jnp.asarray([True, False, False]))
    np.testing.assert_array_equal(np.asarray(cache.refcount)[table[0, :2]], 1)
    cache = pc.release(cache, jnp.asarray([False, True, True]))
    assert int(cache.num_free) == cache.num_pages


def test_running_out_of_pages_is_flagged_and_overwrites_no_other_row():
    cache, _, _, lengths = fill(num_pages=11)  # 3 + 2 + 5 pages in use, 1 free
    table = np.asarray(cache.page_table)
    row2_pages = table[2][table[2] < cache.num_pages]
    free_page = int(cache.free[0])
    held = [np.asarray(k) for k in cache.k]
    rng = np.random.default_rng(3)
    k_new = jnp.asarray(rng.normal(size=(3, 8, KV_HEADS, HEAD_DIM)), jnp.float32)
    grown = write_step(cache, cache.lengths, k_new, k_new, jnp.asarray([8, 8, 0], jnp.int32))
    assert bool(grown.overflow)
    # All or nothing: no page mapped; each row kept what fits its own last page (12 of 12, 8 of
    # 8 tokens), the rest was dropped.
    np.testing.assert_array_equal(grown.page_table, table)
    np.testing.assert_array_equal(grown.lengths, [12, 8, 18])
    for before, after in zip(held, grown.k):
        after = np.asarray(after)
        np.testing.assert_array_equal(after[:, row2_pages], before[:, row2_pages])
        np.testing.assert_array_equal(after[:, free_page], before[:, free_page])
        # Rows 0 and 1: their earlier tokens as they were.
        for row in (0, 1):
            page, offset = table[row][np.arange(lengths[row]) // PAGE], np.arange(lengths[row]) % PAGE
            np.testing.assert_array_equal(after[:, page, offset], before[:, page, offset])
    assert int(grown.num_free) == 1
    # The flag is sticky; a step that fits maps its page.
    fits = write_step(grown, grown.lengths, k_new, k_new, jnp.asarray([0, 2, 0], jnp.int32))
    assert bool(fits.overflow) and int(fits.lengths[1]) == 10 and int(fits.num_free) == 0
    # Past max_len is flagged too.
    long = pc.reserve(pc.init_paged_cache(1, 1, 8, 1, 8, 4, 4), jnp.asarray([9]))
    assert bool(long.overflow)


def test_each_batch_shard_allocates_from_its_own_pool_and_overflows_alone():
    """Two batch shards of 2 rows and 4 pages each (paged_sharding.py): shard 0 asks for 5
    pages and overflows, mapping nothing; shard 1 maps its 3 from its own pool (local ids, its
    own half of the pool array), attends like one pool and gets them back on release."""
    from matpo_jax import parallel
    from matpo_jax.model.kernel_sharding import kernel_mesh
    mesh = parallel.make_mesh(data=2, fsdp=1, tensor=1, devices=jax.devices()[:2])
    cache = pc.init_paged_cache(1, KV_HEADS, HEAD_DIM, 4, 32, 8, PAGE, shards=2)
    assert cache.shards == 2 and cache.no_page == 4
    k_new = jnp.asarray(np.random.default_rng(4).normal(size=(4, 12, KV_HEADS, HEAD_DIM)),
                        jnp.float32)
    num = jnp.asarray([12, 8, 4, 7], jnp.int32)
    q = decode_query(4)

    @jax.jit
    def grow_and_attend(cache):
        with kernel_mesh(mesh):
            cache = write_step(cache, jnp.zeros(4, jnp.int32), k_new, k_new, num)
            last = (cache.lengths - 1)[:, None]
            out = pc.paged_attention_reference(q, cache.k[0], cache.v[0], cache.page_table,
                                               cache.lengths, last)
            return cache, out, pc.release(cache, jnp.asarray([False, False, True, False]))

    grown, out, released = grow_and_attend(cache)
    np.testing.assert_array_equal(grown.overflow, [True, False])
    np.testing.assert_array_equal(grown.num_free, [4, 1])
    np.testing.assert_array_equal(grown.lengths, [0, 0, 4, 7])
    table = np.asarray(grown.page_table)
    assert (table[:2] == 4).all()  # shard 0: nothing mapped
    assert sorted(table[2:][table[2:] < 4].tolist()) == [0, 1, 2]  # shard 1: local ids
    pool = np.asarray(grown.k[0])
    assert not pool[:, :4].any()  # shard 0's pages untouched
    # Shard 1's tokens are in its half of the pool, where its local ids point.
    for row, n in ((2, 4), (3, 7)):
        positions = np.arange(n)
        np.testing.assert_array_equal(
            pool[:, 4 + table[row][positions // PAGE], positions % PAGE],
            np.transpose(np.asarray(k_new)[row, :n], (1, 0, 2)))
    # Rows 2 and 3 attend as the same tokens in one pool do.
    one_pool = write_step(pc.init_paged_cache(1, KV_HEADS, HEAD_DIM, 4, 32, 8, PAGE),
                          jnp.zeros(4, jnp.int32), k_new, k_new,
                          jnp.asarray([0, 0, 4, 7], jnp.int32))
    expected = pc.paged_attention_reference(q, one_pool.k[0], one_pool.v[0],
                                            one_pool.page_table, one_pool.lengths,
                                            (one_pool.lengths - 1)[:, None])
    np.testing.assert_allclose(np.asarray(out)[2:], np.asarray(expected)[2:], atol=1e-6)
    np.testing.assert_array_equal(released.num_free, [4, 2])
    assert int(pc.pages_in_use(released)) == 2


def test_a_sharded_cache_outside_its_mesh_is_refused():
    cache = pc.init_paged_cache(1, KV_HEADS, HEAD_DIM, 4, 32, 8, PAGE, shards=2)
    with pytest.raises(ValueError, match="2 pool"):
        pc.reserve(cache, jnp.ones(4, jnp.int32))
    with pytest.raises(ValueError, match="multiples of 2"):
        pc.init_paged_cache(1, KV_HEADS, HEAD_DIM, 3, 32, 8, PAGE, shards=2)


def test_the_whole_cache_runs_under_jit():
    cache, keys, values, lengths = fill()
    eager = pc.share_pages(cache, cache.page_table[2:], jnp.asarray([1]), jnp.asarray([7]))
    jitted = jax.jit(pc.share_pages)(cache, cache.page_table[2:], jnp.asarray([1]),
                                      jnp.asarray([7]))
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_init_refuses_a_max_len_that_is_not_whole_pages():
    with pytest.raises(ValueError, match="max_len 30 is not a multiple of page_size 4"):
        pc.init_paged_cache(1, 1, 8, 1, 30, 8, 4)


def test_pages_per_compute_block_divides_the_table_and_aims_at_512_tokens():
    assert pages_per_compute_block(640, 64) == 8
    assert pages_per_compute_block(640, 128) == 4
    assert pages_per_compute_block(6, 16) == 2
    assert pages_per_compute_block(5, 16) == 1


def test_rows_go_to_the_kernel_in_groups_whose_page_tables_fit_smem():
    # 512 rows of 640 pages (40,960 tokens in 64-token pages) are 1.25 MiB of table: 2 calls.
    assert rows_per_call(512, 640) == 768 * 1024 // (4 * 640) == 307
    assert rows_per_call(207, 640) == 207 and rows_per_call(3, 10 ** 6) == 1


def ragged_decode_inputs(page_size, pages_per_row, head_dim, seed):
    """One layer's pages for 4 ragged rows (1 token, a page boundary, a full table, mid-page) on
    shuffled pages, and a decode query per row: (q, k_pages, v_pages, cache, lengths)."""
    rng = np.random.default_rng(seed)
    rows, max_len = 4, page_size * pages_per_row
    lengths = jnp.asarray([1, page_size, max_len, page_size + 3], jnp.int32)
    cache = shuffled_free_stack(pc.init_paged_cache(1, KV_HEADS, head_dim, rows, max_len,
                                                    rows * pages_per_row, page_size), seed)
    cache = pc.reserve(cache, lengths)
    k_new = rng.normal(size=(rows, max_len, KV_HEADS, head_dim)).astype(np.float32)
    v_new = rng.normal(size=(rows, max_len, KV_HEADS, head_dim)).astype(np.float32)
    positions = jnp.broadcast_to(jnp.arange(max_len, dtype=jnp.int32), (rows, max_len))
    k, v = pc.write(cache.k[0], cache.v[0], cache.page_table, positions, jnp.asarray(k_new),
                    jnp.asarray(v_new), lengths)
    q = jnp.asarray(rng.normal(size=(rows, HEADS, head_dim)), jnp.float32)
    return q, k, v, cache, lengths


@pytest.mark.parametrize("page_size, pages_per_row, table_bytes", [
    (16, 4, SMEM_TABLE_BYTES), (8, 8, SMEM_TABLE_BYTES),
    (16, 4, 16),  # one row a kernel call
    (8, 8, 96)])  # groups of 3 rows and 1
def test_tpu_paged_kernel_in_interpret_mode_equals_the_reference(page_size, pages_per_row,
                                                                 table_bytes):
    """Ragged rows (1 token, a page boundary, a full table, mid-page) on shuffled pages, in one
    kernel call or in groups; the kernel loads K/V as bfloat16, so the reference gets the same
    rounding (the rest in float32)."""
    q, k, v, cache, lengths = ragged_decode_inputs(page_size, pages_per_row, head_dim=128,
                                                   seed=11)
    rows = q.shape[0]
    got = tpu_paged_decode_attention(q, k, v, cache.page_table, lengths, interpret=True,
                                     table_bytes=table_bytes)
    as_bf16 = lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)
    expected = pc.paged_attention_reference(q[:, None], as_bf16(k), as_bf16(v), cache.page_table,
                                            lengths, (lengths - 1)[:, None])
    np.testing.assert_allclose(got.reshape(rows, -1), expected[:, 0], rtol=2e-5, atol=2e-5)
    # Without the rounding the kernel is only bfloat16-close: the rounding is what differs.
    exact = pc.paged_attention_reference(q[:, None], k, v, cache.page_table, lengths,
                                         (lengths - 1)[:, None])
    assert np.abs(np.asarray(got.reshape(rows, -1) - exact[:, 0])).max() > 1e-4


def test_share_pages_from_a_kept_table_skips_out_of_range_rows():
    cache, keys, values, lengths = fill()
    kept = cache.page_table[2]  # row 2's 18 tokens, as a prompt store keeps its tables
    before = cache
    cache = pc.share_pages(cache, jnp.stack([kept, kept]), jnp.asarray([0, 3]),
                           jnp.asarray([9, 9]))  # row 3 does not exist: that entry is skipped
    table = np.asarray(cache.page_table)
    np.testing.assert_array_equal(table[0, :2], np.asarray(kept[:2]))
    np.testing.assert_array_equal(table[1:], np.asarray(before.page_table[1:]))
    np.testing.assert_array_equal(cache.lengths, [9, lengths[1], lengths[2]])
    np.testing.assert_array_equal(np.asarray(cache.refcount)[np.asarray(kept[:2])], 2)
    # Row 0's own three pages went back; one fresh page holds its copied ninth token.
    assert int(pc.pages_in_use(cache)) == int(pc.pages_in_use(before)) - 3 + 1
    q = decode_query(3, seed=9)
    k_dense, v_dense = dense_from_tokens(keys[[2, 1, 2]], values[[2, 1, 2]], [9, 6, 18],
                                         cache.max_len)
    mask = jnp.arange(cache.max_len)[None, None, :] < jnp.asarray([9, 6, 18])[:, None, None]
    np.testing.assert_allclose(
        pc.paged_attention_reference(q, cache.k[0], cache.v[0], cache.page_table, cache.lengths,
                                     jnp.asarray([[8], [5], [17]])),
        cached_attention(q, k_dense, v_dense, mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("page_size, pages_per_row", [(16, 4), (8, 8), (4, 6)])
def test_gpu_paged_kernel_in_interpret_mode_equals_the_reference(page_size, pages_per_row):
    """The Triton-lowered kernel (model.attention.decode=paged_gpu) reads K/V in the cache's dtype:
    equal to the reference to float32 rounding, on ragged rows over shuffled pages, with the
    table split into partitions (4 and 8 pages: 4 and 8 splits; 6 pages: 2 splits of 3)."""
    q, k, v, cache, lengths = ragged_decode_inputs(page_size, pages_per_row, head_dim=16,
                                                   seed=12)
    rows = q.shape[0]
    got = gpu_paged_decode_attention(q, k, v, cache.page_table, lengths, interpret=True)
    expected = pc.paged_attention_reference(q[:, None], k, v, cache.page_table, lengths,
                                            (lengths - 1)[:, None])
    np.testing.assert_allclose(got.reshape(rows, -1), expected[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("page_size, pages_per_row", [(4, 6), (8, 3)])
def test_tpu_paged_extend_kernel_in_interpret_mode_equals_the_reference(page_size, pages_per_row):
    """Multi-token extends over shuffled pages, rows starting empty, mid-page, on a page boundary
    and near the table's end, writing 1 token up to a whole table; an empty lane (nothing
    written, length 0) gets zeros. Grouped queries (3 heads a kv head), float32 pages."""
    rng = np.random.default_rng(page_size)
    max_len = page_size * pages_per_row
    before = np.asarray([0, 5, page_size, 3, max_len - 2, 0], np.int32)
    num = np.asarray([max_len, 3, page_size + 1, 1, 2, 0], np.int32)
    rows, width = len(before), int(num.max())
    cache = shuffled_free_stack(pc.init_paged_cache(1, KV_HEADS, HEAD_DIM, rows, max_len,
                                                    rows * pages_per_row, page_size), page_size)
    old = jnp.asarray(rng.normal(size=(rows, max_len, KV_HEADS, HEAD_DIM)), jnp.float32)
    cache = write_step(cache, jnp.zeros(rows, jnp.int32), old, -old, jnp.asarray(before))
    new = jnp.asarray(rng.normal(size=(rows, width, KV_HEADS, HEAD_DIM)), jnp.float32)
    cache = write_step(cache, jnp.asarray(before), new, 0.5 * new, jnp.asarray(num))
    assert not bool(cache.overflow)
    positions = jnp.asarray(before)[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
    q = jnp.asarray(rng.normal(size=(rows, width, HEADS, HEAD_DIM)), jnp.float32)
    args = (q, cache.k[0], cache.v[0], cache.page_table, cache.lengths, positions)
    got = np.asarray(tpu_paged_extend_attention(*args, interpret=True))
    expected = np.asarray(pc.paged_attention_reference(*args))
    written = np.arange(width)[None, :] < num[:, None]
    np.testing.assert_allclose(got[written], expected[written], rtol=1e-5, atol=1e-5)
    assert not got[5].any()  # the empty lane
