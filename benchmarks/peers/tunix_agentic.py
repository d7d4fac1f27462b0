"""tunix's agentic rollout path, driven the way its `AgenticRLLearner` drives it, minus training.

The pieces are tunix 0.1.7's own, used as documented:
- `ToolAgent` (rl/agentic/agents/tool_agent.py) with the "qwen" tool parser: its system message is
  our role text + the parser's tools prompt; it parses `<tool_call>` JSON out of each response and
  falls back to a `finish` call (the episode's end) when a response has none;
- `ToolEnvironment` (rl/agentic/environments/tool_environment.py): runs the calls through its
  `ToolManager` (a thread pool per step) and ends the episode on `finish` or at `max_steps`;
- `TrajectoryCollectEngine` under `RolloutOrchestrator` (rl/agentic/trajectory/,
  rl/agentic/pipeline/): one asyncio task per (agent, env) pair, up to `max_concurrency` at
  once, grouped G by G (`GroupQueueManager`), collected in "Token" mode with the tokenizer and
  chat parser as the learner passes them (every step's environment messages are tokenised);
- the model call is `AgenticRLLearner._model_call` + `RLCluster.generate` without the cluster
  (no mesh, no perf spans): the conversation rendered by `QwenChatTemplateParser.parse(...,
  add_generation_prompt=True, is_first_msg=True)`, then `VanillaRollout.generate` on that one
  prompt, i.e. tunix's native `Sampler` at batch 1.

The tools are `BaseTool` subclasses whose `apply` calls our local search service over HTTP with
the same client our engine uses (`tools.worker_toolbox`), so both sides' tool calls cost the
same and return the same text; only the agentic machinery differs.

`ModelCall` records every sampler call (wall interval, real and padded prompt length, sampled
tokens), which is what tunix's path exposes of its decode traffic.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
from tunix.generate.tokenizer_adapter import TokenizerAdapter
from tunix.rl.agentic import utils as agentic_utils
from tunix.rl.agentic.agents.tool_agent import ToolAgent
from tunix.rl.agentic.environments.tool_environment import ToolEnvironment
from tunix.rl.agentic.parser.chat_template_parser.parser import QwenChatTemplateParser
from tunix.rl.agentic.pipeline.rollout_orchestrator import RolloutOrchestrator
from tunix.rl.agentic.tools.base_tool import BaseTool, ToolOutput
from tunix.rl.rollout.base_rollout import CacheConfig, RolloutConfig, RolloutOutput
from tunix.rl.rollout.vanilla_rollout import VanillaRollout

from matpo_jax.tools import OPEN_SCHEMA, SEARCH_SCHEMA


class _ServiceTool(BaseTool):
    """A tool whose call is one request to our search service (through `toolbox`)."""

    schema: dict = {}
    toolbox: Any = None

    def get_json_schema(self) -> dict:
        return self.schema

    def apply(self, **arguments) -> ToolOutput:
        result = self.toolbox.call(self.name, arguments)
        # The text the model reads either way (errors are already "Error: ..." texts).
        return ToolOutput(name=self.name, output=result.text)


def tool_map(toolbox) -> dict[str, type[BaseTool]]:
    """name -> tool class, as ToolAgent / ToolEnvironment take them (each instantiates its own);
    `search` and `open` with our schemas, answered by `toolbox` (our HTTP clients)."""
    classes = {}
    for schema in (SEARCH_SCHEMA, OPEN_SCHEMA):
        function = schema["function"]
        classes[function["name"]] = type(
            f"{function['name'].title()}ServiceTool", (_ServiceTool,),
            {"__doc__": function["description"], "schema": schema, "toolbox": toolbox})
    return classes


def chat_parser(hf_tokenizer) -> QwenChatTemplateParser:
    return QwenChatTemplateParser(hf_tokenizer)


def make_pairs(questions: Sequence[str], group_size: int, system_prompt: str,
               tools: dict[str, type[BaseTool]], max_steps: int):
    """(ToolAgent, ToolEnvironment) per rollout, G per question, numbered as the learner does
    (group_id per question, pair_index within the group)."""
    pairs = []
    for group_id, question in enumerate(questions):
        for pair_index in range(group_size):
            agent = ToolAgent(system_prompt=system_prompt, tool_parser_name="qwen", tool_map=tools)
            env = ToolEnvironment({"question": question}, tool_map=tools, max_steps=max_steps,
                                  group_id=group_id, pair_index=pair_index)
            pairs.append((agent, env))
    return pairs


@dataclasses.dataclass
class CallRecord:
    start: float
    end: float
    prompt_tokens: int  # the prompt's real tokens
    padded_prompt: int  # the prompt buffer the sampler prefilled (padded length)
    sampled: int  # tokens sampled, the stop token included when the turn stopped on one
    stopped: bool  # ended on an eos token (else it ran to the token cap)


class ModelCall:
    """The learner's model call on tunix's native sampler (VanillaRollout), one prompt a call."""

    def __init__(self, rollout: VanillaRollout, parser: QwenChatTemplateParser,
                 config: RolloutConfig, follow_budget: bool = False):
        """follow_budget: as RLCluster.generate, a `max_generation_steps` from the engine (its
        remaining response budget) replaces the config's max_tokens_to_generate; off, every call
        samples up to the config's per-turn cap."""
        self.rollout, self.parser, self.config = rollout, parser, config
        self.follow_budget = follow_budget
        self.calls: list[CallRecord] = []
        self._lock = threading.Lock()
        self._pad = rollout.pad_id()

    def __call__(self, messages, env=None, max_generation_steps=None, **_) -> RolloutOutput:
        prompt = self.parser.parse(messages=messages, add_generation_prompt=True,
                                   is_first_msg=True)
        config = self.config
        if self.follow_budget and max_generation_steps is not None:
            config = dataclasses.replace(config, max_tokens_to_generate=max_generation_steps)
        start = time.perf_counter()
        out = self.rollout.generate([prompt], config)
        end = time.perf_counter()
        padded = np.asarray(out.left_padded_prompt_tokens)
        sampled = len(out.tokens[0])
        stopped = sampled < config.max_tokens_to_generate
        with self._lock:
            self.calls.append(CallRecord(start, end, int((padded[0] != self._pad).sum()),
                                         int(padded.shape[1]), sampled + int(stopped), stopped))
        return out

    def reset(self) -> None:
        self.calls = []


def make_rollout(model, hf_tokenizer, cache_size: int) -> VanillaRollout:
    config = model.config
    return VanillaRollout(model, hf_tokenizer, CacheConfig(
        cache_size=cache_size, num_layers=config.num_layers, num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim))


def collect(pairs, model_call: Callable, group_size: int, max_concurrency: int,
            tokenizer=None, parser=None, mode: str = "Token", timeout: float = 600.0,
            max_response_length: int | None = None) -> list:
    """Runs every pair through RolloutOrchestrator as AgenticRLLearner._orchestrator_producer
    does (producer task + yield_batches of G); returns the TrajectoryItems in arrival order."""
    engine_kwargs = dict(model_call=model_call, timeout=timeout,
                         max_response_length=max_response_length, overlong_filter=False)
    if tokenizer is not None:
        engine_kwargs.update(tokenizer=TokenizerAdapter(tokenizer), chat_parser=parser)

    async def run():
        orchestrator = RolloutOrchestrator(rollout_sync_lock=agentic_utils.RolloutSyncLock(),
                                           engine_kwargs=engine_kwargs,
                                           max_concurrency=max_concurrency)
        producer = asyncio.create_task(orchestrator.run_producers_from_stream(
            pairs_stream=iter(pairs), group_size=group_size,
            group_key_fn=lambda i, env, traj: env.extra_kwargs["group_id"], collect_mode=mode))
        await asyncio.sleep(0)
        items = []
        async for batch in orchestrator.yield_batches(batch_size=group_size):
            items.extend(batch)
        await producer
        return items

    return asyncio.run(run())


def assistant_texts(item) -> list[str]:
    """The responses of one collected trajectory (Token or Conversation mode)."""
    traj = item.traj
    messages = traj["conversation_text"] if isinstance(traj, dict) else traj
    return [m["content"] for m in messages if m["role"] == "assistant"]


def tool_messages(item) -> int:
    """Tool outputs the environment fed back into one trajectory (one per executed call)."""
    traj = item.traj
    messages = traj["conversation_text"] if isinstance(traj, dict) else traj
    return sum(m["role"] == "tool" for m in messages)


class ScriptedModelCall:
    """A model call that answers with scripted responses, to record the exact prompts tunix's
    agent renders at every turn (what the shared checkpoint is fitted on). `respond(question,
    turn)` gives the response text; `roundtrip` maps it through the tokenizer as the sampler's
    decode would."""

    def __init__(self, parser, respond: Callable[[str, int], str],
                 roundtrip: Callable[[str], str] = lambda text: text):
        self.parser, self.respond, self.roundtrip = parser, respond, roundtrip
        self.turns: list[tuple[str, str]] = []  # (prompt text, response text)
        self._lock = threading.Lock()

    def __call__(self, messages, env=None, max_generation_steps=None, **_) -> RolloutOutput:
        prompt = self.parser.parse(messages=messages, add_generation_prompt=True,
                                   is_first_msg=True)
        turn = sum(m["role"] == "assistant" for m in messages)
        text = self.roundtrip(self.respond(env.task["question"], turn))
        with self._lock:
            self.turns.append((prompt, text))
        return RolloutOutput(text=[text], logits=[], tokens=[np.zeros(0, np.int32)],
                             left_padded_prompt_tokens=None, logprobs=None)


def profile_calls(rollout: VanillaRollout, prompts: Sequence[str], config: RolloutConfig) -> dict:
    """Where one model call's time goes: the prompts run one after another (no concurrency),
    the sampler's two jitted programs timed to completion (block_until_ready), the rest of
    `Sampler.__call__` (tokenising the whole conversation, building the sampling state and the
    fresh KV cache with eager ops, fetching and detokenising the result) as host time.
    Measurement only: the two jit attributes are wrapped for the duration and restored."""
    import jax

    sampler = rollout._sampler  # noqa: SLF001 - timing its two compiled programs
    spent = {"prefill": 0.0, "decode": 0.0}
    originals = sampler._compiled_prefill_fn, sampler._compiled_decode_fn  # noqa: SLF001

    def timed(name, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            out = jax.block_until_ready(fn(*args, **kwargs))
            spent[name] += time.perf_counter() - start
            return out
        return run

    sampler._compiled_prefill_fn = timed("prefill", originals[0])  # noqa: SLF001
    sampler._compiled_decode_fn = timed("decode", originals[1])  # noqa: SLF001
    try:
        rollout.generate([prompts[0]], config)  # compiled already by the bench; not counted
        spent.update(prefill=0.0, decode=0.0)
        start = time.perf_counter()
        sampled = sum(len(rollout.generate([p], config).tokens[0]) for p in prompts)
        total = time.perf_counter() - start
    finally:
        sampler._compiled_prefill_fn, sampler._compiled_decode_fn = originals  # noqa: SLF001
    calls = len(prompts)
    return dict(calls=calls, sampled=sampled, total_s=total, prefill_s=spent["prefill"],
                decode_s=spent["decode"],
                host_s=total - spent["prefill"] - spent["decode"],
                ms_per_call=1e3 * total / calls,
                decode_ms_per_token=1e3 * spent["decode"] / max(1, sampled - calls))
