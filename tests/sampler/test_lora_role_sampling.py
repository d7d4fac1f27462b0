"""Per-role LoRA adapters in ONE decode batch: a planner adapter and a worker adapter over one
base; each slot decodes (and takes its injections, and starts from a prefix) with its role's
adapter, so every trajectory's tokens and log-probs equal decoding it alone with its adapter."""
import jax
import numpy as np
import pytest
from flax import nnx

from matpo_jax.model import CausalLM
from matpo_jax.model import lora as lora_lib
from matpo_jax.sampler.host_protocol import SlotInjection
from matpo_jax.sampler.loop import Sampling, run_slots
from fixtures.profiled_host import ProfiledHost

PROMPTS = [[4, 4, 1, 9], [60, 2, 33, 12, 5], [11, 3, 17]]
ROLES = [0, 1, 1]  # a planner and two workers in one batch
PROFILE_ROLES = (0, 1)  # profile p decodes with role p's adapter (as agents/rollout.py)


@pytest.fixture(scope="module")
def per_role_model(tiny_model):
    model = CausalLM(tiny_model.config, rngs=nnx.Rngs(0))  # the sampler tests' base
    lora_lib.add_adapters(model, lora_lib.LoRAConfig(rank=4, alpha=8.0, roles="per_role"), seed=1)
    graphdef, adapters, base = lora_lib.split_trainable(model)
    keys = iter(jax.random.split(jax.random.key(2), len(jax.tree.leaves(adapters))))
    adapters = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), adapters)
    return nnx.split(nnx.merge(graphdef, adapters, base))


def _decode(per_role_model, scripted_host, shapes, indices):
    graphdef, state = per_role_model
    sampling = Sampling(temperature=1.0, max_turn_tokens=shapes.max_turn)
    host = scripted_host([PROMPTS[i] for i in indices], shapes.slots, turns=2,
                         streams=[10 + i for i in indices])
    run_slots(state, graphdef, ProfiledHost(host, [ROLES[i] for i in indices]), slots=shapes.slots,
              max_len=shapes.max_len, sampling=sampling, more_profiles=[(sampling, ())],
              profile_roles=PROFILE_ROLES, rng=jax.random.key(4))
    return host


def test_each_trajectory_equals_decoding_it_alone_with_its_adapter(per_role_model, scripted_host,
                                                                    shapes):
    together = _decode(per_role_model, scripted_host, shapes, range(len(PROMPTS)))
    for i in range(len(PROMPTS)):
        alone = _decode(per_role_model, scripted_host, shapes, [i])
        assert together.tokens[i] == alone.tokens[0], i
        assert together.trainable[i] == alone.trainable[0]
        np.testing.assert_allclose(together.logprobs[i], alone.logprobs[0], atol=1e-5)


def test_recorded_logprobs_are_the_roles_adapter_and_not_the_others(per_role_model,
                                                                     scripted_host, shapes,
                                                                     padded_logits):
    together = _decode(per_role_model, scripted_host, shapes, range(len(PROMPTS)))
    wrong_gap = 0.0
    for i, role in enumerate(ROLES):
        trained = np.flatnonzero(together.trainable[i])
        assert trained.size > 0
        for as_role in (role, 1 - role):
            logp = _log_softmax_rows(padded_logits, per_role_model, together.tokens[i], as_role)
            full = logp[trained - 1, np.asarray(together.tokens[i])[trained]]
            recorded = np.asarray(together.logprobs[i])[trained]
            if as_role == role:
                np.testing.assert_allclose(recorded, full, atol=1e-4)
            else:
                wrong_gap = max(wrong_gap, float(np.abs(recorded - full).max()))
    assert wrong_gap > 1e-2  # the other role's adapter would have recorded other log-probs


def _log_softmax_rows(padded_logits, per_role_model, tokens, role):
    """[len(tokens), vocab] log-probs of the whole-sequence forward, role's adapter on every token."""
    logits = padded_logits(*per_role_model, tokens, role).astype(np.float64)
    logits = logits - logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


class _PrefixHost:
    """Starts slot i from prefix i (the first two tokens of PROMPTS[i], computed once when the
    loop starts, with role ROLES[i]'s adapter) plus the rest of its prompt; one turn each."""

    def __init__(self):
        self.turns = [None] * len(PROMPTS)

    def __call__(self, events):
        slots = len(PROMPTS)
        injection = SlotInjection.nothing(slots, 8)
        first = all(t is None for t in self.turns) and not np.asarray(events.stopped).any()
        for slot in range(slots):
            if first:
                rest = PROMPTS[slot][2:]
                injection.tokens[slot, :len(rest)] = rest
                injection.num[slot] = len(rest)
                injection.reset[slot], injection.prefix[slot] = True, slot
                injection.stream[slot], injection.profile[slot] = 20 + slot, ROLES[slot]
            elif events.stopped[slot] and self.turns[slot] is None:
                self.turns[slot] = events.turn(slot)
            injection.active[slot] = self.turns[slot] is None
        injection.done = not injection.active.any()
        return injection


def test_prefixes_are_computed_with_the_adapter_of_their_role(per_role_model, shapes,
                                                              padded_logits):
    graphdef, state = per_role_model
    sampling = Sampling(temperature=1.0, max_turn_tokens=shapes.max_turn)
    host = _PrefixHost()
    run_slots(state, graphdef, host, slots=len(PROMPTS), max_len=shapes.max_len,
              sampling=sampling, more_profiles=[(sampling, ())], profile_roles=PROFILE_ROLES,
              prefixes=[p[:2] for p in PROMPTS], prefix_roles=ROLES, rng=jax.random.key(5))
    for i, role in enumerate(ROLES):
        tokens, logprobs = host.turns[i]
        assert len(tokens) > 0
        full = list(PROMPTS[i]) + [int(t) for t in tokens]
        start = len(PROMPTS[i])
        positions = np.arange(start, len(full))
        for as_role, close in ((role, True), (1 - role, False)):
            reference = _log_softmax_rows(padded_logits, per_role_model, full, as_role)[
                positions - 1, np.asarray(tokens)]
            if close:
                np.testing.assert_allclose(np.asarray(logprobs), reference, atol=1e-4)
            else:
                assert np.abs(np.asarray(logprobs) - reference).max() > 1e-2
