"""Episodes of the real SmolLM2-135M-Instruct (tests/fixtures/smollm2.py) through the rollout
engine: MATPO planners (and any workers they start), sampled by the jitted slot
loop in SmolLM2's real vocabulary, against the local search service.

What an untrained pretrained model writes is its own business (zero-shot it mostly answers at
once, sometimes calls a tool by a wrong name); what the engine owes RL is checked on whatever it
wrote: every trajectory's recorded log-probs are the model's own teacher-forced log-probs of its
tokens, trained ids are exactly the sampled text, and contexts are ChatML in its vocabulary."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from matpo_jax.agents.rollout import run_rollouts
from matpo_jax.agents.trajectory import PLANNER
from matpo_jax.chat import ChatFormat
from matpo_jax.config import RolloutSection
from matpo_jax.model import load_pretrained

QUESTIONS = ["Where was the founder of the Northwind Company born?",
             "Who is the chief engineer of the Northwind Company?"]
# log_softmax of the full forward vs the sampler's, cached decode path: float32 over 30 layers
# differs by ~1e-4 in the logits (test_smollm2_real.py), so by ~2e-4 in a log-probability.
LOGPROB_TOL = 2e-3
BUCKET = 256  # the teacher-forced forward's length step


@pytest.fixture(scope="module")
def smollm2_policy(smollm2_dir):
    graphdef, state = nnx.split(load_pretrained(smollm2_dir))
    return ChatFormat.from_pretrained(smollm2_dir), graphdef, state


def test_episodes_record_the_models_own_logprobs(smollm2_policy, toolbox):
    """MATPO mode (the planner's role and tools; a worker runs whenever a sampled subagent call
    parses). One mode only: each compiles the 30-layer slot loop anew, ~2 minutes here."""
    chat, graphdef, state = smollm2_policy
    mode = "matpo"
    cfg = RolloutSection(mode=mode, group_size=4, decode_slots=8, max_context=1536,
                         max_new_tokens_per_turn=40, max_turns_planner=2, max_turns_worker=2,
                         temperature=1.0, reuse_prefixes=False, final_summary_max_tokens=32)
    batch = run_rollouts(state, graphdef, chat, toolbox, QUESTIONS, cfg, jax.random.key(0))
    assert batch.metrics["errors"] == 0
    leads = batch.by_role(PLANNER)
    assert len(leads) == len(QUESTIONS) * cfg.group_size
    forward = jax.jit(lambda s, t: jax.nn.log_softmax(nnx.merge(graphdef, s)(t), axis=-1))
    worst = 0.0
    for agent in batch.rollouts:
        assert agent.finish_reason and agent.num_turns >= 1
        tokens = np.asarray(agent.tokens)
        assert tokens.max() < chat.id_count
        text = chat.decode(agent.tokens)
        assert text.startswith("<|im_start|>system\nYou are a ")
        sampled = [t for t, trained in zip(agent.tokens, agent.trainable) if trained]
        assert chat.decode(sampled).replace("<|im_end|>", "") == "".join(
            agent.assistant_texts).replace("<|im_end|>", "")
        # Padded at the end to a multiple of BUCKET (causal: no earlier row changes), so the
        # trajectories share a few compiled forwards instead of one per length.
        padded = np.zeros((1, -(-len(tokens) // BUCKET) * BUCKET), tokens.dtype)
        padded[0, :len(tokens)] = tokens
        logprobs = np.asarray(forward(state, jnp.asarray(padded))[0, :len(tokens)])
        positions = np.flatnonzero(agent.trainable)
        expected = logprobs[positions - 1, tokens[positions]]
        worst = max(worst, float(np.abs(expected - np.asarray(agent.logprobs)[positions]).max()))
    print(f"\n{mode}: {len(batch.rollouts)} trajectories, max |log-prob diff| = {worst:.2e}")
    assert worst < LOGPROB_TOL
