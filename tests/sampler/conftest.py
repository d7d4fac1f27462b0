"""Shared pieces for the sampler tests: one tiny GQA Qwen3, a full-forward reference, and fixed
loop shapes so every test file reuses the same few compilations of the slot loop."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from matpo_jax.model import DecoderConfig, CausalLM
from matpo_jax.sampler.host_protocol import SlotInjection
from matpo_jax.sampler.loop import Sampling

MAX_LEN = 64  # cache length of every slot-loop test
VOCAB = 96


@dataclasses.dataclass(frozen=True)
class LoopShapes:
    """The static shapes every slot-loop test uses (test modules must not import conftest)."""

    slots: int = 3
    max_len: int = MAX_LEN
    max_turn: int = 8


@pytest.fixture(scope="session")
def shapes():
    return LoopShapes()


@pytest.fixture(scope="session")
def greedy(shapes):
    return Sampling(greedy=True, max_turn_tokens=shapes.max_turn)


@pytest.fixture(scope="session")
def tiny_model():
    # A wide init makes the random model's distributions peaked: greedy ties are far apart and
    # top-p truncation actually removes tokens.
    config = DecoderConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, initializer_range=0.3)
    return CausalLM(config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="session")
def split_model(tiny_model):
    graphdef, state = nnx.split(tiny_model)
    return graphdef, state


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens, role):
    roles = None if role is None else jnp.full_like(tokens, role)
    return nnx.merge(graphdef, state)(tokens, roles=roles)


@pytest.fixture(scope="session")
def padded_logits():
    """(graphdef, state, seq, role=None) -> float32 logits [len(seq), V] from the plain forward
    pass (no cache; `role`: that role's LoRA adapter on every token), the sequence padded at its
    end to MAX_LEN so each model compiles once (causal: the padding changes no earlier row)."""

    def logits_of(graphdef, state, seq, role=None):
        padded = np.zeros((1, MAX_LEN), np.int32)
        padded[0, :len(seq)] = seq
        return np.asarray(_forward(graphdef, state, jnp.asarray(padded), role)[0, :len(seq)])

    return logits_of


@pytest.fixture(scope="session")
def full_logits(tiny_model, padded_logits):
    """seq (list of ids, len <= MAX_LEN) -> the tiny model's logits (padded_logits)."""
    graphdef, state = nnx.split(tiny_model)
    return lambda seq: padded_logits(graphdef, state, seq)


@pytest.fixture(scope="session")
def greedy_reference(full_logits):
    """Greedy continuation of a context by recomputing the full forward each step."""

    def continue_greedily(context, steps):
        seq = list(context)
        for _ in range(steps):
            seq.append(int(np.argmax(full_logits(seq)[-1])))
        return seq[len(context):]

    return continue_greedily


class ScriptedToolHost:
    """A rollout-engine stand-in: runs each prompt for `turns` turns through the slots; between
    turns it appends a fixed non-trainable "tool response" chunk. More prompts than slots queue up
    and reuse freed slots. It rebuilds every sequence token-in, token-out and logs each event."""

    def __init__(self, prompts, slots, chunk=(7, 8, 9, 10, 11), turns=2, streams=None,
                 prefixes=()):
        self.pending = list(enumerate(prompts))[::-1]
        # Registered prompt prefixes (run_slots' `prefixes`): a new sequence starts from the
        # longest one it begins with (SlotInjection.prefix); hits: their lengths, in order.
        self.prefixes = [list(p) for p in prefixes]
        self.hits = []
        self.streams = streams  # per prompt: its SlotInjection.stream (None: the slots' own)
        self.slot_seq = [None] * slots
        self.chunk = list(chunk)
        self.turns = turns
        self.tokens = [list(p) for p in prompts]
        self.trainable = [[False] * len(p) for p in prompts]
        self.logprobs = [[0.0] * len(p) for p in prompts]
        self.turns_done = [0] * len(prompts)
        self.stop_reasons = [[] for _ in prompts]
        self.slots_used = [set() for _ in prompts]
        self.calls = 0
        self.log = []  # (call, slot, seq, stop_reason, turn_len, cache_len)

    def __call__(self, events):
        slots = len(self.slot_seq)
        injection = SlotInjection.nothing(slots, MAX_LEN)
        for slot in range(slots):
            seq = self.slot_seq[slot]
            if seq is not None and events.stopped[slot]:
                tokens, logprobs = events.turn(slot)
                self.tokens[seq] += tokens.tolist()
                self.trainable[seq] += [True] * len(tokens)
                self.logprobs[seq] += logprobs.tolist()
                self.turns_done[seq] += 1
                self.stop_reasons[seq].append(int(events.stop_reason[slot]))
                self.log.append((self.calls, slot, seq, int(events.stop_reason[slot]),
                                 int(events.turn_len[slot]), int(events.cache_len[slot])))
                # The cache holds exactly the context built so far (sampled stop token included).
                assert events.cache_len[slot] == len(self.tokens[seq]), (slot, seq)
                if self.turns_done[seq] < self.turns:
                    self._write(injection, slot, self.chunk, reset=False)
                    self.tokens[seq] += self.chunk
                    self.trainable[seq] += [False] * len(self.chunk)
                    self.logprobs[seq] += [0.0] * len(self.chunk)
                else:
                    self.slot_seq[slot] = seq = None
            if seq is None and self.pending:
                seq, prompt = self.pending.pop()
                self.slot_seq[slot] = seq
                self.slots_used[seq].add(slot)
                self._write(injection, slot, prompt, reset=True)
                if self.streams is not None:
                    injection.stream[slot] = self.streams[seq]
            injection.active[slot] = seq is not None
        injection.done = not injection.active.any()
        self.calls += 1
        return injection

    def _write(self, injection, slot, tokens, reset):
        if reset:
            starts = [i for i, p in enumerate(self.prefixes) if tokens[:len(p)] == p]
            if starts:
                index = max(starts, key=lambda i: len(self.prefixes[i]))
                injection.prefix[slot] = index
                self.hits.append(len(self.prefixes[index]))
                tokens = tokens[len(self.prefixes[index]):]
        injection.tokens[slot, :len(tokens)] = tokens
        injection.num[slot] = len(tokens)
        injection.reset[slot] = reset


@pytest.fixture(scope="session")
def scripted_host():
    return ScriptedToolHost
