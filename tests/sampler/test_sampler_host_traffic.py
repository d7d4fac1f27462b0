"""What crosses to and from the host per round: the stopped turns packed flat, the injected tokens
read per extend, and SlotLoopStats.round_bytes counting exactly that."""
import jax
import jax.numpy as jnp
import numpy as np

from matpo_jax.sampler.host_transfer import flat_widths, pack_rows, unpack_rows
from matpo_jax.sampler.loop import default_buckets, run_slots
from matpo_jax.sampler.writes import extend_width


def test_flat_widths_grow_geometrically_up_to_the_limit():
    assert flat_widths(24) == (24,)
    assert flat_widths(1500) == (256, 1024, 1500)
    assert flat_widths(512 * 8192) == (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)


def test_pack_rows_round_trips_the_stopped_turns():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 1000, (5, 300)).astype(np.int32)
    logprobs = -rng.random((5, 300)).astype(np.float32)
    counts = np.array([0, 3, 0, 290, 1], np.int32)  # 294 entries: the 1024-wide transfer
    width = next(w for w in flat_widths(5 * 300) if w >= counts.sum())
    pack = jax.jit(pack_rows, static_argnums=2)
    flat_tokens = np.asarray(pack(jnp.asarray(tokens), jnp.asarray(counts), width))
    flat_logprobs = np.asarray(pack(jnp.asarray(logprobs), jnp.asarray(counts), width))
    assert flat_tokens.shape == (1024,) and (flat_tokens[294:] == 0).all()
    for flat, full in ((flat_tokens, tokens), (flat_logprobs, logprobs)):
        unpacked = unpack_rows(flat, counts, 300)
        for row, n in enumerate(counts):
            np.testing.assert_array_equal(unpacked[row, :n], full[row, :n])
            assert (unpacked[row, n:] == 0).all()


class _RecordingHost:
    """Wraps a host and keeps, per round, the turn lengths of the stopped slots it received and
    the num of the injection it answered."""

    def __init__(self, host):
        self.host, self.turns, self.nums = host, [], []

    def __call__(self, events):
        self.turns.append(np.where(events.stopped, events.turn_len, 0))
        injection = self.host(events)
        self.nums.append(np.asarray(injection.num))
        return injection


def test_round_bytes_are_the_packed_turns_and_the_extends_reads(split_model, scripted_host,
                                                                 shapes, greedy):
    graphdef, state = split_model
    slots, max_len, max_turn = shapes.slots, shapes.max_len, shapes.max_turn
    prompts = [[5, 6, 7], list(range(20, 40)), [9] * 17, [3]]
    host = _RecordingHost(scripted_host(prompts, slots, chunk=[7, 8, 9, 10, 11], turns=2))
    stats = run_slots(state, graphdef, host, slots=slots, max_len=max_len, sampling=greedy)
    assert stats.host_calls == len(host.turns) == len(stats.round_bytes)

    buckets, lanes = default_buckets(max_len), 1  # the defaults at 3 slots: (16, 64), 1 lane
    flat = flat_widths(slots * max_turn)[0]  # 24: every turn of these shapes fits one width
    control_in = 4 + slots * (1 + 4 + 4 + 4)  # session id, stopped, stop_reason, turn_len, cache_len
    # num, reset, active, prefix, turn_cap, stream, sampling profile, done
    control_out = slots * (4 + 1 + 1 + 4 + 4 + 4 + 4) + 1
    expected = []
    for counts, num in zip(host.turns, host.nums):
        assert counts.sum() <= flat
        reads = [extend_width(int(n), buckets) for n in num if n > 0]  # one lane each
        expected.append((control_in + flat * (4 + 4) + len(reads) * (4 + 4 * lanes + 4),
                         control_out + sum(4 * lanes * width for width in reads)))
    assert list(stats.round_bytes) == expected
    # The old protocol returned [slots, max_len] int32 tokens every round.
    assert max(r[1] for r in stats.round_bytes) < 4 * slots * max_len
    assert stats.bytes_from_host == sum(r[1] for r in expected)
