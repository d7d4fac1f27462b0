"""A tiny Qwen3 that has memorised scripted planner/worker dialogues (rollout tests, benchmarks).

Each script is a scripted conversation per role. Tool outputs in the scripts are the REAL outputs
of the toolbox (fetched before fitting), and worker reports are produced by the same cleaning as
the engine, so the contexts the engine assembles at replay are exactly the memorised ones and
greedy decoding replays the scripted turns. The demonstrations are rendered with `ChatFormat.render`
(whole conversations), while the engine assembles contexts incrementally: a replay that diverges
means the two disagree.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from matpo_jax.agents import prompts
from matpo_jax import tools
from matpo_jax.model import DecoderConfig, CausalLM
from matpo_jax.chat import ChatFormat, MalformedToolCall, format_tool_call, parse_tool_call
from matpo_jax.chat.tokenizer_training import train_tokenizer

# A small world: pages the search server indexes.
CORPUS = [
    {"id": "d1", "title": "Ada Lovelace",
     "contents": "Ada Lovelace was a mathematician. Ada Lovelace was born in London."},
    {"id": "d2", "title": "Alan Turing",
     "contents": "Alan Turing was a computer scientist. Alan Turing was born in Maida Vale."},
    {"id": "d3", "title": "Grace Hopper",
     "contents": "Grace Hopper was a naval officer. Grace Hopper was born in New York."},
]

RunTool = Callable[[str, dict], str]  # (name, arguments) -> the tool response text


@dataclasses.dataclass(frozen=True)
class WorkerScript:
    subtask: str
    calls: tuple[tuple[str, dict], ...]  # the worker's search/open calls, one per turn
    answer: str  # its last tool-loop turn (no tool call)
    summary: str  # its final-summary turn


@dataclasses.dataclass(frozen=True)
class SingleScript:
    question: str
    calls: tuple[tuple[str, dict], ...]
    answer: str


@dataclasses.dataclass(frozen=True)
class PlannerScript:
    question: str
    workers: tuple[WorkerScript, ...]  # one subagent call per planner turn...
    answer: str  # the planner's final turn
    parallel: bool = False  # ...or all of them in its first turn
    malformed_first: str | None = None  # a first turn with a malformed tool call


def subagent_call(subtask: str) -> str:
    return format_tool_call("subagent", {"subtask": subtask})


def worker_conversation(question: str, script: WorkerScript, run_tool: RunTool,
                        user_query_recap: bool = True) -> list[dict]:
    system = ChatFormat.system_prompt(prompts.WORKER_ROLE, [tools.SEARCH_SCHEMA, tools.OPEN_SCHEMA])
    task = prompts.worker_recap(question, script.subtask) if user_query_recap else script.subtask
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    for name, arguments in script.calls:
        messages.append({"role": "assistant", "content": format_tool_call(name, arguments)})
        messages.append({"role": "tool", "content": run_tool(name, arguments)})
    messages.append({"role": "assistant", "content": script.answer})
    messages.append({"role": "user", "content": prompts.FINAL_SUMMARY_INSTRUCTION})
    messages.append({"role": "assistant", "content": script.summary})
    return messages


def planner_conversation(script: PlannerScript, report_max_chars: int) -> list[dict]:
    system = ChatFormat.system_prompt(prompts.PLANNER_ROLE, [tools.SUBAGENT_SCHEMA])
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": prompts.question_prompt(script.question)}]
    if script.malformed_first is not None:
        try:
            parse_tool_call(script.malformed_first, [tools.SUBAGENT_SCHEMA])
            raise ValueError(f"not malformed: {script.malformed_first!r}")
        except MalformedToolCall as malformed:
            error = prompts.malformed_call_text(malformed.reason)
        messages.append({"role": "assistant", "content": script.malformed_first})
        messages.append({"role": "tool", "content": error})
    reports = [{"role": "tool", "content": prompts.clean_report(w.summary, report_max_chars)}
               for w in script.workers]
    if script.parallel:
        calls = "\n".join(subagent_call(w.subtask) for w in script.workers)
        messages.append({"role": "assistant", "content": calls})
        messages.extend(reports)
    else:
        for worker, report in zip(script.workers, reports):
            messages.append({"role": "assistant", "content": subagent_call(worker.subtask)})
            messages.append(report)
    messages.append({"role": "assistant", "content": script.answer})
    return messages


def single_conversation(script: SingleScript, run_tool: RunTool) -> list[dict]:
    system = ChatFormat.system_prompt(prompts.SINGLE_ROLE, [tools.SEARCH_SCHEMA, tools.OPEN_SCHEMA])
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": prompts.question_prompt(script.question)}]
    for name, arguments in script.calls:
        messages.append({"role": "assistant", "content": format_tool_call(name, arguments)})
        messages.append({"role": "tool", "content": run_tool(name, arguments)})
    messages.append({"role": "assistant", "content": script.answer})
    return messages


@dataclasses.dataclass
class ScriptedPolicy:
    """A tokenizer and a fitted model, with the conversations they replay."""

    chat: ChatFormat
    graphdef: nnx.GraphDef
    state: nnx.State
    margin: float  # the smallest logit margin of a scripted token over the runner-up
    conversations: dict[str, list[dict]]  # "planner:<question>", "worker:<subtask>", "single:<q>"

    def teacher_logprobs(self, sequences: Sequence[list[int]], length: int) -> np.ndarray:
        """log p(token t | tokens < t) for each sequence (row t-1 scores token t), one padded
        batch of `length` so one compilation serves every call."""
        tokens = np.zeros((len(sequences), length), np.int32)
        for row, ids in enumerate(sequences):
            tokens[row, :len(ids)] = ids
        return np.asarray(_teacher_logprobs(self.graphdef, self.state, jnp.asarray(tokens)))

    def render(self, key: str) -> tuple[list[int], list[bool]]:
        """A scripted conversation as the engine assembles it (without the final newline)."""
        ids, trainable = self.chat.render(self.conversations[key])
        return ids[:-1], trainable[:-1]


@functools.partial(jax.jit, static_argnums=0)
def _teacher_logprobs(graphdef, state, tokens):
    logits = nnx.merge(graphdef, state)(tokens[:, :-1])
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logprobs, tokens[:, 1:, None], axis=-1)[..., 0]


def scripted_policy(planners: Sequence[PlannerScript], singles: Sequence[SingleScript],
                    run_tool: RunTool, report_max_chars: int, max_steps: int = 400,
                    learning_rate: float = 1e-2, vocab_size: int = 1024,
                    user_query_recap: bool = True, think: str = "",
                    architecture: dict | None = None) -> ScriptedPolicy:
    """Fetches the real tool outputs, trains a tokenizer and fits a tiny model to the scripts.

    think: reasoning text (`<think>...</think>`) opening every worker tool-call turn, for
    workloads whose tool loops decode long turns, as real reasoning models' do.
    architecture: DecoderConfig fields replacing the tiny defaults (vocab_size is the tokenizer's).
    """
    conversations = {}
    for script in planners:
        conversations[f"planner:{script.question}"] = planner_conversation(script, report_max_chars)
        for worker in script.workers:
            conversations[f"worker:{worker.subtask}"] = worker_conversation(
                script.question, worker, run_tool, user_query_recap)
    for script in singles:
        conversations[f"single:{script.question}"] = single_conversation(script, run_tool)
    for key, conversation in conversations.items():
        for message in conversation:
            if (key.startswith("worker:") and message["role"] == "assistant"
                    and "<tool_call>" in message["content"]):
                message["content"] = think + message["content"]
    texts = [m["content"] for conv in conversations.values() for m in conv]
    chat = ChatFormat(train_tokenizer(texts * 4, vocab_size))
    model = tiny_model(len(chat.tokenizer), **(architecture or {}))
    graphdef, state, margin = fit(model, [chat.render(c) for c in conversations.values()],
                                  max_steps, learning_rate)
    return ScriptedPolicy(chat, graphdef, state, margin, conversations)


def tiny_model(vocab_size: int, seed: int = 0, **architecture) -> CausalLM:
    fields = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  max_position_embeddings=4096)
    config = DecoderConfig(vocab_size=vocab_size, **{**fields, **architecture})
    return CausalLM(config, rngs=nnx.Rngs(seed))


def fit(model: CausalLM, sequences: Sequence[tuple[list[int], list[bool]]],
        max_steps: int = 400, learning_rate: float = 1e-2, margin: float = 1.0,
        check_every: int = 5) -> tuple[nnx.GraphDef, nnx.State, float]:
    """Supervised fit on the trainable tokens of `sequences` until greedy decoding replays them.

    Stops once every trainable target beats every other token by `margin` logits (so greedy
    replays the scripts, with room for small numeric differences between the cached decode and
    this full forward pass). Returns (graphdef, state, the smallest margin reached).
    """
    length = max(len(ids) for ids, _ in sequences)
    tokens = np.zeros((len(sequences), length), np.int32)
    targets_mask = np.zeros((len(sequences), length), np.float32)
    for row, (ids, trainable) in enumerate(sequences):
        tokens[row, :len(ids)] = ids
        targets_mask[row, :len(ids)] = trainable
    inputs = jnp.asarray(tokens[:, :-1])
    targets = jnp.asarray(tokens[:, 1:])
    mask = jnp.asarray(targets_mask[:, 1:])
    graphdef, params = nnx.split(model)
    optimizer = optax.adam(learning_rate)
    opt_state = optimizer.init(params)

    def loss_fn(params):
        logits = nnx.merge(graphdef, params)(inputs)
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        return jnp.sum(nll * mask) / jnp.sum(mask), logits

    @jax.jit
    def step(params, opt_state):
        (_, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        # Margin of the pre-update parameters: cheap, it reuses the forward pass.
        target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        others = jnp.where(jax.nn.one_hot(targets, logits.shape[-1], dtype=bool), -jnp.inf, logits)
        worst = jnp.min(jnp.where(mask > 0, target_logit - jnp.max(others, axis=-1), jnp.inf))
        return optax.apply_updates(params, updates), opt_state, worst

    best_margin = -np.inf
    for index in range(max_steps):
        new_params, opt_state, worst = step(params, opt_state)
        if index % check_every == 0 or index == max_steps - 1:
            best_margin = float(worst)
            if best_margin >= margin:
                break  # `params` (before this update) already replay the scripts
        params = new_params
    return graphdef, params, best_margin
