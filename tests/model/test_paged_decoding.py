"""The decoder's cached generation over a paged KV cache (model/paged_cache.py) against the dense
cache: ragged prefills, extends and greedy decode steps give the same logits and tokens; the
TPU and GPU paged kernels (model.attention.decode=paged_tpu | paged_gpu, Pallas interpret mode
here) decode like the XLA path on the same cache (bfloat16 for the TPU kernel), per tensor shard
too; a dense cache asked for the kernel says it runs xla."""
import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from matpo_jax.model import CausalLM, DecoderConfig, attention_dispatch, init_cache
from matpo_jax.model import paged_cache as pc

CONFIG = DecoderConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)
ROWS, MAX_LEN, PAGE = 3, 48, 4


def paged(config, num_pages=30, dtype=jnp.float32, seed=0):
    cache = pc.init_paged_cache(config.num_hidden_layers, config.num_key_value_heads,
                                config.head_dim, ROWS, MAX_LEN, num_pages, PAGE, dtype)
    order = np.random.default_rng(seed).permutation(num_pages).astype(np.int32)
    return cache._replace(free=jnp.asarray(order))  # pages handed out out of order


def prompts(seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.integers(1, CONFIG.vocab_size, (ROWS, 11)), jnp.int32),
            jnp.asarray([5, 11, 2], jnp.int32))


def jitted(model, method):
    """model.<method> as one jitted program (eager calls of a 2-layer model cost more than
    compiling it once)."""
    graphdef, state = nnx.split(model)
    call = jax.jit(lambda state, *args: getattr(nnx.merge(graphdef, state), method)(*args))
    return lambda *args: call(state, *args)


def generate(model, cache, steps=10):
    """Prefill, a ragged extend, then greedy decode steps (row 1 idle every third step):
    the logits of every call and the tokens chosen."""
    prefill, extend_last, decode = (jitted(model, m) for m in ("prefill", "extend_last", "decode"))
    tokens, lengths = prompts()
    logits, cache = prefill(tokens, lengths, cache)
    seen = [np.asarray(logits[jnp.arange(ROWS), lengths - 1])]
    extra, _ = prompts(seed=1)
    logits, cache = extend_last(extra[:, :4], jnp.asarray([4, 1, 3]), cache)
    seen.append(np.asarray(logits))
    chosen = []
    for step in range(steps):
        next_tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        active = jnp.asarray([True, step % 3 != 0, True])
        logits, cache = decode(next_tokens, cache, active)
        seen.append(np.asarray(logits)[np.asarray(active)])
        chosen.append(np.asarray(next_tokens))
    return seen, np.stack(chosen), cache


def test_paged_cache_generates_the_dense_caches_logits_and_tokens():
    model = CausalLM(CONFIG, rngs=nnx.Rngs(0))
    dense_logits, dense_tokens, dense = generate(model, init_cache(CONFIG, ROWS, MAX_LEN))
    paged_logits, paged_tokens, cache = generate(model, paged(CONFIG))
    np.testing.assert_array_equal(paged_tokens, dense_tokens)
    for a, b in zip(paged_logits, dense_logits):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cache.lengths, dense.lengths)
    # The pool holds the tokens written, page by page, not rows x MAX_LEN.
    assert int(pc.pages_in_use(cache)) == int(np.sum(-(-np.asarray(cache.lengths) // PAGE)))
    assert not bool(cache.overflow)
    # A new prefill gives every row's pages back before writing.
    tokens, lengths = prompts(seed=2)
    _, again = model.prefill(tokens, lengths, cache)
    assert int(pc.pages_in_use(again)) == int(np.sum(-(-np.asarray(lengths) // PAGE)))


def test_jitted_decode_over_pages_matches_eager():
    model = CausalLM(CONFIG, rngs=nnx.Rngs(1))
    tokens, lengths = prompts()
    _, cache = model.prefill(tokens, lengths, paged(CONFIG))
    active = jnp.ones((ROWS,), bool)
    jitted_logits, jitted_cache = jitted(model, "decode")(tokens[:, 0], cache, active)
    eager_logits, eager_cache = model.decode(tokens[:, 0], cache, active)
    np.testing.assert_allclose(jitted_logits, eager_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(jitted_cache.page_table, eager_cache.page_table)


def test_tpu_paged_kernel_decodes_like_xla_on_the_same_bfloat16_cache():
    # The kernel loads K/V as bfloat16: with a bfloat16 cache both paths read the same values.
    config = dataclasses.replace(CONFIG, num_attention_heads=2, num_key_value_heads=1,
                                 head_dim=128, hidden_size=64)
    model = CausalLM(config, rngs=nnx.Rngs(2))
    kernel_model = CausalLM(dataclasses.replace(config, attention_decode="paged_tpu"),
                            rngs=nnx.Rngs(2))
    tokens, lengths = prompts()
    _, cache = model.prefill(tokens, lengths, paged(config, dtype=jnp.bfloat16))
    step_tokens = tokens[:, 0]
    active = jnp.ones((ROWS,), bool)
    with attention_dispatch.record() as uses:
        got, got_cache = kernel_model.decode(step_tokens, cache, active)
    assert attention_dispatch.implementations(uses) == {"decode": "paged_tpu (interpret)"}
    expected, expected_cache = model.decode(step_tokens, cache, active)
    # The XLA path rounds the softmax weights to the cache's bfloat16 before the value product
    # (as the dense path does); the kernel keeps them in float32: ~2^-8 relative on each weight.
    # (The kernel alone equals the reference to 2e-5 on the same inputs: test_paged_cache.py.)
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(jnp.argmax(got, -1), jnp.argmax(expected, -1))
    # The new token's keys went to the same pages (layer 0's are the same bits: no attention
    # lies before them).
    np.testing.assert_array_equal(got_cache.page_table, expected_cache.page_table)
    np.testing.assert_array_equal(np.asarray(got_cache.k[0], np.float32),
                                  np.asarray(expected_cache.k[0], np.float32))


def test_the_tpu_extend_kernel_prefills_and_extends_like_xla():
    """model.attention.extend=paged_tpu: the prefill and the ragged extend (rows writing 4, 1
    and 3 tokens after prompts of 5, 11 and 2) run our Pallas extend kernel in interpret mode;
    the logits of every call, the greedy tokens and the pages written equal the XLA path's."""
    model = CausalLM(CONFIG, rngs=nnx.Rngs(6))
    kernel_model = CausalLM(dataclasses.replace(CONFIG, attention_extend="paged_tpu"),
                            rngs=nnx.Rngs(6))
    expected_logits, expected_tokens, expected = generate(model, paged(CONFIG), steps=3)
    with attention_dispatch.record() as uses:
        got_logits, got_tokens, got = generate(kernel_model, paged(CONFIG), steps=3)
    assert attention_dispatch.implementations(uses) == {"extend": "paged_tpu (interpret)",
                                                        "decode": "xla"}
    np.testing.assert_array_equal(got_tokens, expected_tokens)
    for a, b in zip(got_logits, expected_logits):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got.page_table, expected.page_table)


def test_a_dense_cache_asked_for_the_paged_kernel_says_it_runs_xla(caplog):
    config = dataclasses.replace(CONFIG, attention_decode="paged_tpu")
    model = CausalLM(config, rngs=nnx.Rngs(0))
    reference = CausalLM(CONFIG, rngs=nnx.Rngs(0))
    tokens, lengths = prompts()
    _, cache = reference.prefill(tokens, lengths, init_cache(CONFIG, ROWS, MAX_LEN))
    attention_dispatch._logged.clear()
    with caplog.at_level(logging.WARNING), attention_dispatch.record() as uses:
        got, _ = model.decode(tokens[:, 0], cache, jnp.ones((ROWS,), bool))
    assert "this cache is dense (rollout.kv_cache=paged pages it); running xla" in caplog.text
    assert attention_dispatch.implementations(uses) == {"decode": "xla"}
    expected, _ = reference.decode(tokens[:, 0], cache, jnp.ones((ROWS,), bool))
    np.testing.assert_array_equal(got, expected)


def test_the_samplers_lane_injection_writes_pages_like_the_dense_cache():
    """sampler/writes.inject with fewer lanes than rows gathers sub-caches (`rows`) and scatters
    them back (`set_rows`): over pages, the rows' tables move and the pool is shared."""
    from matpo_jax.sampler.writes import array_reader, inject
    model = CausalLM(CONFIG, rngs=nnx.Rngs(3))
    tokens, lengths = prompts()
    results = []
    for cache in (init_cache(CONFIG, ROWS, MAX_LEN), paged(CONFIG)):
        _, cache = model.prefill(tokens, lengths, cache)
        logits = jnp.zeros((ROWS, CONFIG.vocab_size), jnp.float32)
        extra, _ = prompts(seed=4)
        num = jnp.asarray([0, 7, 3], jnp.int32)  # row 0 receives nothing
        cache, logits = jax.jit(lambda c, l: inject(model, c, l, array_reader(extra), num,
                                                    buckets=(4, 8), lanes=1, max_num=8))(
            cache, logits)
        # A decode step after it reads what the injection wrote.
        after, cache = model.decode(tokens[:, 0], cache, jnp.ones((ROWS,), bool))
        results.append((np.asarray(logits), np.asarray(after), np.asarray(cache.lengths)))
    for dense, paged_result in zip(*results):
        np.testing.assert_allclose(paged_result, dense, rtol=1e-5, atol=1e-5)


def test_the_paged_kernel_over_a_tensor_mesh_runs_per_shard_like_on_one_device():
    """Under a kernel mesh the kernel runs under shard_map, each device its kv heads of the pool
    (parallel.paged_cache_shardings): the same logits as the unsharded kernel."""
    from matpo_jax import parallel
    from matpo_jax.model.kernel_sharding import kernel_mesh
    config = dataclasses.replace(CONFIG, attention_decode="paged_tpu", head_dim=128,
                                 hidden_size=64)
    model = CausalLM(config, rngs=nnx.Rngs(3))
    tokens, lengths = prompts()
    _, cache = model.prefill(tokens, lengths, paged(config, dtype=jnp.bfloat16))
    active = jnp.ones((ROWS,), bool)
    expected, _ = model.decode(tokens[:, 0], cache, active)
    mesh = parallel.make_mesh(data=1, fsdp=1, tensor=2, devices=jax.devices()[:2])
    graphdef, state = nnx.split(model)
    state = jax.device_put(state, parallel.param_shardings(state, mesh))
    cache = jax.device_put(cache, parallel.cache_shardings(cache, mesh))
    assert cache.k[0].sharding.shard_shape(cache.k[0].shape)[0] == 1  # one kv head a device

    @jax.jit
    def decode(state, token, cache):
        with kernel_mesh(mesh):
            return nnx.merge(graphdef, state).decode(token, cache, active)

    with attention_dispatch.record() as uses:
        got, _ = decode(state, tokens[:, 0], cache)
    assert attention_dispatch.implementations(uses) == {"decode": "paged_tpu (interpret)"}
    # o_proj's sum over heads splits into two partial sums: float32 rounding (2e-7 seen).
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(jnp.argmax(got, -1), jnp.argmax(expected, -1))


def test_a_pool_per_batch_shard_prefills_and_decodes_like_one_pool_with_the_kernel_per_shard():
    """Rows over data=2 and kv heads over tensor=2: each batch shard's rows allocate from its own
    pool (paged_sharding.py) and the TPU kernels (the prefill's extend, the decode step) run on
    each device's rows, kv heads and pages; the logits equal one pool's on one device."""
    from matpo_jax import parallel
    from matpo_jax.model.kernel_sharding import kernel_mesh
    config = dataclasses.replace(CONFIG, attention_decode="paged_tpu", head_dim=128,
                                 hidden_size=64, attention_extend="paged_tpu")
    model = CausalLM(config, rngs=nnx.Rngs(5))
    rows, pages = 4, 24
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(1, config.vocab_size, (rows, 11)), jnp.int32)
    lengths = jnp.asarray([5, 11, 2, 9], jnp.int32)
    active = jnp.asarray([True, False, True, True])

    def empty(shards):
        return pc.init_paged_cache(config.num_hidden_layers, config.num_key_value_heads,
                                   config.head_dim, rows, MAX_LEN, pages, PAGE, jnp.bfloat16,
                                   shards=shards)
    _, one_pool = model.prefill(tokens, lengths, empty(1))
    expected, _ = model.decode(tokens[:, 0], one_pool, active)
    mesh = parallel.make_mesh(data=2, fsdp=1, tensor=2, devices=jax.devices()[:4])
    graphdef, state = nnx.split(model)
    state = jax.device_put(state, parallel.param_shardings(state, mesh))
    sharded = empty(2)
    sharded = jax.device_put(sharded, parallel.cache_shardings(sharded, mesh))
    # One kv head and half the pages a device.
    assert sharded.k[0].sharding.shard_shape(sharded.k[0].shape) == (1, pages // 2, PAGE, 128)

    @jax.jit
    def prefill_and_decode(state, tokens, lengths, cache):
        with kernel_mesh(mesh):
            model = nnx.merge(graphdef, state)
            _, cache = model.prefill(tokens, lengths, cache)
            return model.decode(tokens[:, 0], cache, active)

    with attention_dispatch.record() as uses:
        got, cache = prefill_and_decode(state, tokens, lengths, sharded)
    assert attention_dispatch.implementations(uses) == {"extend": "paged_tpu (interpret)",
                                                        "decode": "paged_tpu (interpret)"}
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # Each shard used its own pool: rows 0-1 hold shard 0's pages, rows 2-3 shard 1's (local
    # ids), and each pool's free count is its own pages minus its rows' ceil(length / PAGE).
    held = -(-np.asarray(cache.lengths) // PAGE)
    np.testing.assert_array_equal(np.asarray(cache.num_free),
                                  [pages // 2 - held[:2].sum(), pages // 2 - held[2:].sum()])
    table = np.asarray(cache.page_table)
    for rows_of_shard in (table[:2], table[2:]):  # local ids: distinct, within a shard's pool
        mapped = rows_of_shard[rows_of_shard != pages // 2]  # pages // 2: a shard's no_page
        assert len(set(mapped.tolist())) == len(mapped) and mapped.max() < pages // 2
    assert (table != pages // 2).sum(axis=1).tolist() == held.tolist()


def test_the_gpu_paged_kernel_decodes_like_xla_on_the_same_cache():
    config = dataclasses.replace(CONFIG, attention_decode="paged_gpu")
    model = CausalLM(CONFIG, rngs=nnx.Rngs(4))
    kernel_model = CausalLM(config, rngs=nnx.Rngs(4))
    tokens, lengths = prompts()
    _, cache = model.prefill(tokens, lengths, paged(CONFIG))
    active = jnp.asarray([True, False, True])
    with attention_dispatch.record() as uses:
        got, got_cache = kernel_model.decode(tokens[:, 0], cache, active)
    assert attention_dispatch.implementations(uses) == {"decode": "paged_gpu (interpret)"}
    expected, expected_cache = model.decode(tokens[:, 0], cache, active)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got_cache.lengths, expected_cache.lengths)


def test_auto_picks_the_paged_kernel_of_the_backend_and_interprets_it_elsewhere():
    assert attention_dispatch.plan_paged_decode("auto", "tpu") == ("paged_tpu", False, None)
    assert attention_dispatch.plan_paged_decode("auto", "gpu") == ("paged_gpu", False, None)
    assert attention_dispatch.plan_paged_decode("auto", "cpu") == ("xla", False, None)
    name, interpret, note = attention_dispatch.plan_paged_decode("paged_gpu", "tpu")
    assert (name, interpret) == ("paged_gpu", True) and "a gpu kernel on tpu" in note
    # Multi-token extends: our TPU kernel on a TPU; XLA's reference elsewhere (no GPU kernel).
    assert attention_dispatch.plan_paged_extend("auto", "tpu") == ("paged_tpu", False, None)
    assert attention_dispatch.plan_paged_extend("auto", "gpu") == ("xla", False, None)
    assert attention_dispatch.plan_paged_extend("auto", "cpu") == ("xla", False, None)
    name, interpret, note = attention_dispatch.plan_paged_extend("paged_tpu", "cpu")
    assert (name, interpret) == ("paged_tpu", True) and "model.attention.extend=paged_tpu" in note
