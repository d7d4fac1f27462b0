"""Rollouts of a Qwen3 with the real Qwen3 tokenizer and official chat template, on the real
jitted sampler and the local search server: what a real Qwen3 does and the engine must handle.

The models are hand-set (fixtures/hf_models.py build_scripted_qwen3): each turn is one added token
holding the turn's text, then a chosen turn end, so each test knows exactly what is sampled:
- a worker turn with two calls (search + open) runs both, at once, and is answered by one user
  turn with one <tool_response> per call in call order, as the official template renders two tool
  messages; past `max_tool_calls_per_turn` a call is answered by an error text;
- a planner turn with two subagent calls starts two workers that decode side by side;
- every eos id of the checkpoint (<|im_end|>, <|endoftext|>) ends a turn;
- the embedding rows no token has (151,673.. here) are never sampled.
"""
from __future__ import annotations

import dataclasses
import threading

import jax
import pytest
from flax import nnx

from fixtures.hf_models import ScriptedTurns, build_scripted_qwen3
from matpo_jax.agents import prompts
from matpo_jax.agents.rollout import run_rollouts
from matpo_jax.agents.rollout_metrics import rollout_stats
from matpo_jax.agents.trajectory import PLANNER, SINGLE, WORKER
from matpo_jax.chat import format_tool_call
from matpo_jax.config import RolloutSection
from matpo_jax.model import load_pretrained
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA

QUESTION = "Where was Ada Lovelace born?"
SEARCH = ("search", {"query": "Ada Lovelace born"})
OPEN = ("open", {"id": "d1"})
TWO_CALLS = format_tool_call(*SEARCH) + "\n" + format_tool_call(*OPEN)
ANSWER = "\\boxed{London}"
CONFIG = RolloutSection(mode="matpo", group_size=1, decode_slots=4, max_context=2048,
                        max_new_tokens_per_turn=8, max_worker_calls_per_turn=2,
                        temperature=0.0, max_turns_planner=3, max_turns_worker=3,
                        reuse_prefixes=False)


@dataclasses.dataclass
class Policy:
    chat: object
    graphdef: object
    state: object


def load_policy(path, turns: ScriptedTurns, tokenizer_json: bytes, **options) -> Policy:
    checkpoint = build_scripted_qwen3(path, turns, tokenizer_json=tokenizer_json, **options)
    graphdef, state = nnx.split(load_pretrained(checkpoint.path))
    return Policy(checkpoint.chat_format(), graphdef, state)


def rollout(policy: Policy, toolbox, cfg: RolloutSection = CONFIG, **kwargs):
    return run_rollouts(policy.state, policy.graphdef, policy.chat, toolbox, [QUESTION], cfg,
                        jax.random.key(0), **kwargs)


class ConcurrentCalls:
    """The real toolbox, whose calls each wait until `parties` calls are running at once (a
    barrier): calls that ran one after the other fail with BrokenBarrierError."""

    def __init__(self, real, parties: int):
        self.real, self.metrics = real, real.metrics
        self.barrier = threading.Barrier(parties, timeout=20)
        self.calls = []

    def call(self, name, arguments):
        self.barrier.wait()
        self.calls.append((name, arguments))
        return self.real.call(name, arguments)


@pytest.fixture(scope="module")
def delegating_policy(tmp_path_factory, real_qwen3_tokenizer_json):
    """A planner that delegates twice in one turn, workers that search and open in one turn."""
    turns = ScriptedTurns(
        planner_first=format_tool_call("subagent", {"subtask": "Find Ada Lovelace's birthplace."})
        + "\n" + format_tool_call("subagent", {"subtask": "Confirm where Ada Lovelace was born."}),
        planner_after_tool=ANSWER, worker_first=TWO_CALLS,
        worker_after_tool="Ada Lovelace was born in London (d1).")
    return load_policy(tmp_path_factory.mktemp("qwen3_real_delegating"), turns,
                       real_qwen3_tokenizer_json)


def test_parallel_calls_all_run_at_once_and_are_answered_in_call_order(delegating_policy,
                                                                        toolbox):
    policy, chat = delegating_policy, delegating_policy.chat
    # Two workers x (search, open) in their first turns: all four calls in flight together.
    concurrent = ConcurrentCalls(toolbox, parties=4)
    batch = rollout(policy, concurrent)
    assert batch.metrics["errors"] == 0
    (planner,), workers = batch.by_role(PLANNER), batch.by_role(WORKER)
    assert len(workers) == 2 and planner.finish_reason == "answer"
    assert ANSWER in planner.assistant_texts[-1]
    for worker in workers:
        assert [(c.name, c.arguments, c.valid, c.error) for c in worker.tool_calls] == [
            (*SEARCH, True, None), (*OPEN, True, None)]
        assert worker.tool_calls[0].turn == worker.tool_calls[1].turn == 0
    # The worker's context so far is, id for id, the official template's rendering of the turn
    # and its two tool messages (one user turn, a <tool_response> block per call, in order).
    results = [toolbox.call(*SEARCH).text, toolbox.call(*OPEN).text]
    messages = [{"role": "system", "content": prompts.ROLE_TEXT[WORKER]},
                {"role": "user", "content": prompts.worker_recap(
                    QUESTION, "Find Ada Lovelace's birthplace.")},
                {"role": "assistant", "content": TWO_CALLS},
                *({"role": "tool", "content": text} for text in results)]
    official = list(chat.tokenizer.apply_chat_template(
        messages, tools=[SEARCH_SCHEMA, OPEN_SCHEMA], add_generation_prompt=True, tokenize=True,
        return_dict=False))
    first = next(w for w in workers if "birthplace" in chat.decode(w.tokens))
    assert first.tokens[:len(official)] == official
    assert chat.decode(official).count("<tool_response>") == 2
    # Masks mean what they meant: trained = exactly the sampled ids (one script token and the
    # turn's <|im_end|> per turn); tool responses and prompts are context only.
    for agent in batch.rollouts:
        sampled = [t for t, trained in zip(agent.tokens, agent.trainable) if trained]
        assert chat.decode(sampled) == "".join(agent.assistant_texts)
        assert len(sampled) == 2 * agent.num_turns
    stats = rollout_stats(batch.rollouts)
    assert stats["tool_calls_per_turn_max/worker"] == 2.0
    assert stats["tool_calls_per_turn_max/planner"] == 2.0


def test_calls_past_the_cap_get_an_error_text_and_do_not_run(delegating_policy, toolbox):
    policy, chat = delegating_policy, delegating_policy.chat
    cfg = dataclasses.replace(CONFIG, max_worker_calls_per_turn=1)
    batch = rollout(policy, toolbox, cfg, max_tool_calls_per_turn=1)
    assert batch.metrics["tool_calls_over_limit"] == 1  # one worker, its open call refused
    (worker,) = batch.by_role(WORKER)
    search, refused = worker.tool_calls[:2]
    assert search.error is None and refused.error == "not run: too many tool calls in one turn"
    text = chat.decode(worker.tokens)
    assert "Error: at most 1 tool call(s) per turn; this one was not run." in text
    assert text.count("<tool_response>") >= 2  # the search's answer, then the refusal


@pytest.mark.parametrize("turn_end", ["<|im_end|>", "<|endoftext|>"])
def test_every_eos_id_of_the_checkpoint_ends_a_turn(tmp_path, real_qwen3_tokenizer_json,
                                                    toolbox, turn_end):
    """A model forced to end its turns with `turn_end` (Qwen3's generation_config.json eos ids).
    The sampled end is trained; after <|endoftext|> the template's <|im_end|> is written."""
    turns = ScriptedTurns(planner_first=format_tool_call(*SEARCH), planner_after_tool=ANSWER,
                          worker_first="(no worker)", worker_after_tool="(no worker either)")
    policy = load_policy(tmp_path, turns, real_qwen3_tokenizer_json, turn_end=turn_end)
    chat = policy.chat
    assert chat.stop_ids == (151643, 151645)
    batch = rollout(policy, toolbox, dataclasses.replace(CONFIG, mode="single"))
    (agent,) = batch.by_role(SINGLE)
    assert agent.finish_reason == "answer" and agent.num_turns == 2
    assert [c.name for c in agent.tool_calls] == ["search"] and agent.tool_calls[0].valid
    end = chat.tokenizer.convert_tokens_to_ids(turn_end)
    trained = [i for i, t in enumerate(agent.trainable) if t]
    assert len(trained) == 4 and agent.tokens[trained[1]] == agent.tokens[trained[3]] == end
    after = agent.tokens[trained[1] + 1:trained[1] + 3]
    if end == chat.im_end_id:
        assert after == chat.encode("\n<|im_start|>")
    else:  # the turn is closed as the template closes it, untrained
        assert after == [chat.im_end_id] + chat.encode("\n")
        assert not agent.trainable[trained[1] + 1]


def test_rows_without_a_token_are_never_sampled(tmp_path, real_qwen3_tokenizer_json, toolbox):
    """Row 151,935 (no token) leads <|im_end|> after every script token: it must not be drawn,
    greedily or at temperature 1."""
    turns = ScriptedTurns(planner_first=format_tool_call(*SEARCH), planner_after_tool=ANSWER,
                          worker_first="(no worker)", worker_after_tool="(no worker either)")
    policy = load_policy(tmp_path, turns, real_qwen3_tokenizer_json, non_token_lead=3.0)
    assert policy.chat.id_count == 151673
    for temperature in (0.0, 1.0):
        cfg = dataclasses.replace(CONFIG, mode="single", temperature=temperature)
        (agent,) = rollout(policy, toolbox, cfg).by_role(SINGLE)
        assert max(agent.tokens) < policy.chat.id_count
        if temperature == 0.0:
            assert agent.finish_reason == "answer" and ANSWER in agent.assistant_texts[-1]
