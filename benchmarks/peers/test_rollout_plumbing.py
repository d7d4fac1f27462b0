"""Checks behind the tool-rollout comparison (rollout_bench.py) that need no fitted model: tunix's
agentic path, as tunix_agentic.py drives it, really calls our local search service (every tool
call one request, answered with the text our own client returns), and its model call runs
tunix's native sampler at batch 1 with the prompt buffer the bench reports.

Runs in the peers venv (`make bench-peers`); elsewhere it skips, since it needs tunix.
"""
import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tunix")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "agents"))
import rollout_bench  # noqa: E402
import tunix_agentic  # noqa: E402
from matpo_jax import tools  # noqa: E402
from matpo_jax.agents import prompts  # noqa: E402
from matpo_jax.tools.search_server import SearchServer  # noqa: E402


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(doc) + "\n" for doc in rollout_bench.CORPUS))
    with SearchServer(corpus) as server:
        yield server, rollout_bench.ServerCounts(server), tools.worker_toolbox(server.url)


class _Names:
    bos_token, eos_token = None, "<|im_end|>"


def test_tunix_tool_calls_reach_the_search_service(service):
    server, counts, toolbox = service
    counts.take()
    group = 2
    turns = rollout_bench.tunix_turns(toolbox, tunix_agentic.chat_parser(_Names()))
    calls = [c for s in rollout_bench.SCRIPTS for c in s.calls]
    assert counts.take() == dict(search=sum(n == "search" for n, _ in calls),
                                 page=sum(n == "open" for n, _ in calls))
    assert len(turns) == sum(len(s.calls) + 1 for s in rollout_bench.SCRIPTS)

    # G rollouts per question, through the orchestrator: every call is one request, and each
    # tool output the agent reads is our client's text behind tunix's prefix.
    by_question = {prompts.question_prompt(s.question): s for s in rollout_bench.SCRIPTS}
    teacher = tunix_agentic.ScriptedModelCall(
        tunix_agentic.chat_parser(_Names()),
        lambda q, t: rollout_bench.scripted_response(by_question[q], t))
    pairs = tunix_agentic.make_pairs(list(by_question), group, prompts.SINGLE_ROLE,
                                     tunix_agentic.tool_map(toolbox), rollout_bench.MAX_TURNS)
    items = tunix_agentic.collect(pairs, teacher, group, len(pairs), mode="Conversation")
    assert len(items) == len(pairs)
    assert counts.take() == dict(search=group * sum(n == "search" for n, _ in calls),
                                 page=group * sum(n == "open" for n, _ in calls))
    for item in items:
        script = by_question[[m for m in item.traj if m["role"] == "user"][0]["content"]]
        outputs = [m["content"] for m in item.traj if m["role"] == "tool"]
        assert outputs == ["Tool returned result: " + toolbox.call(n, a).text
                           for n, a in script.calls]
    counts.take()


def test_model_call_runs_tunix_sampler_at_batch_one(service, tmp_path):
    """One episode on a random checkpoint: the model call renders the conversation, samples on
    tunix's VanillaRollout with one row, and records the padded prompt buffer."""
    from tunix.rl.rollout.base_rollout import RolloutConfig
    import tunix_side
    from matpo_jax.chat import ChatFormat
    from matpo_jax.chat.tokenizer_training import train_tokenizer
    from matpo_jax.model import save_pretrained
    from scripted_agents import tiny_model

    _, _, toolbox = service
    hf = train_tokenizer([prompts.SINGLE_ROLE, json.dumps(tools.SEARCH_SCHEMA)] * 4, 512)
    chat = ChatFormat(hf)
    save_pretrained(tiny_model(chat.id_count), str(tmp_path))
    rollout = tunix_agentic.make_rollout(tunix_side.load(str(tmp_path)), hf, 1024)
    config = RolloutConfig(max_tokens_to_generate=8, max_prompt_length=1016, kv_cache_size=1024,
                           top_p=None, top_k=None, eos_tokens=list(chat.stop_ids))
    model_call = tunix_agentic.ModelCall(rollout, tunix_agentic.chat_parser(hf), config)
    pairs = tunix_agentic.make_pairs(["Where was Ada Lovelace born?"], 1, prompts.SINGLE_ROLE,
                                     tunix_agentic.tool_map(toolbox), max_steps=2)
    items = tunix_agentic.collect(pairs, model_call, 1, 1, tokenizer=hf,
                                  parser=tunix_agentic.chat_parser(hf))
    assert len(items) == 1 and model_call.calls
    call = model_call.calls[0]
    assert call.padded_prompt == 1016 and 0 < call.prompt_tokens < 1016
    assert 1 <= call.sampled <= 8
    # The trajectory keeps the first call's prompt as the sampler saw it (left-padded).
    prompt = np.asarray(items[0].traj["prompt_tokens"])
    assert (prompt != rollout.pad_id()).sum() == call.prompt_tokens
