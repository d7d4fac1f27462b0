"""How many decode slots fit a per-chip budget: the KV-cache arithmetic and the start-up error."""
import pytest

from matpo_jax.model import DecoderConfig
from matpo_jax.sampler.capacity import (DecodeSlotsError, check_decode_slots, decode_slot_budget,
                                        kv_bytes_per_slot)

# Qwen3-4B: 36 layers, 8 kv heads of 128, vocabulary 151,936; the cache in bfloat16.
QWEN3_4B = DecoderConfig(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                       num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, dtype="bfloat16")
GIB = 2**30


def test_kv_bytes_per_slot_is_layers_heads_dim_len_kv_dtype_over_tensor():
    whole = 36 * 8 * 128 * 40960 * 2 * 2
    assert kv_bytes_per_slot(QWEN3_4B, 40960) == whole == 6_039_797_760  # 5.6 GiB per slot
    assert kv_bytes_per_slot(QWEN3_4B, 40960, tensor=8) == whole // 8
    assert kv_bytes_per_slot(QWEN3_4B, 40960, tensor=4, dtype="float32") == whole // 4 * 2
    # 3 does not divide 8 kv heads: every tensor shard holds them all (parallel.fit_spec).
    assert kv_bytes_per_slot(QWEN3_4B, 40960, tensor=3) == whole


def test_slots_that_fit_a_v5e_64_at_the_paper_context():
    # v5e-64 as data 8 x tensor 8, 8 GiB per chip left for the sampler.
    budget = decode_slot_budget(QWEN3_4B, 40960, 8 * GIB, data=8, tensor=8, max_turn=8192)
    per_slot = 36 * 1 * 128 * 40960 * 2 * 2 + 4 * 151936 + 8 * 8192
    assert budget.bytes_per_slot == per_slot
    assert budget.slots_per_chip == 8 * GIB // per_slot == 11
    assert budget.slots_that_fit == 88
    assert check_decode_slots(88, QWEN3_4B, 40960, 8 * GIB, data=8, tensor=8,
                              max_turn=8192) == budget


def test_too_many_slots_is_one_clear_error():
    with pytest.raises(DecodeSlotsError, match=r"^rollout\.decode_slots=512 does not fit: only "
                       r"88 decode slots fit \(11 per chip x 8 data x fsdp shards\); one slot "
                       r"needs 720\.6 MiB per chip \(KV cache 36 layers x 1 kv heads x 128 x "
                       r"max_len 40960 x 2 x 2 bytes = 720\.0 MiB\)"):
        check_decode_slots(512, QWEN3_4B, 40960, 8 * GIB, data=8, tensor=8, max_turn=8192)


def test_slots_that_do_not_split_over_the_batch_shards_are_rejected():
    with pytest.raises(DecodeSlotsError, match=r"decode_slots=100 is not a multiple of mesh "
                                               r"data x fsdp = 8"):
        check_decode_slots(100, QWEN3_4B, 4096, 8 * GIB, data=2, fsdp=4, tensor=1)
