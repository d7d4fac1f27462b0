"""Multi-turn tool rollouts side by side: tunix's agentic path vs our engine (`rollout.mode=single`),
then our MATPO mode (planner + workers), on the same questions, group size and turn caps.

One Qwen3 checkpoint for both sides: a small Qwen3 fitted to scripted search dialogues (as in
benchmarks/rollout.py), saved once as a Hugging Face directory (our `save_pretrained` + the
tokenizer) and loaded by each side's own loader. Decoding is greedy, so every rollout replays its
script: a search-tool loop (each tool-call turn reasons for ~45 tokens first), then an answer.
Because tunix's agent renders its contexts in its own way (its tools prompt, "Tool returned
result: " before every tool output, the history re-rendered as text every turn), the checkpoint
is fitted on both sides' contexts: ours as our engine assembles them, tunix's as recorded from
its own ToolAgent / ToolEnvironment / TrajectoryCollectEngine with a scripted model call. Both
sides therefore sample the same responses and make the same tool calls (checked every run),
and the comparison times the same work.

- ours: `run_rollouts` (mode single, G per question, all rollouts in one decode batch of
  `decode_slots` = questions x G slots), the search service over HTTP;
- tunix: tunix_agentic.py (ToolAgent + ToolEnvironment + RolloutOrchestrator, its native
  Sampler through VanillaRollout, one prompt per model call, `max_concurrency` = questions x G);
- ours in MATPO mode: each question's planner delegates the same search loop to one worker.

Both tool sides call the same local search service (127.0.0.1) through the same HTTP client;
the service counts the requests it answers per side (cross-check). Timing: the sides
interleaved in every repeat after one warm-up each (which compiles; reported as first-call
seconds); medians and per-repeat ratios.

    .venv-peers/bin/python benchmarks/peers/rollout_bench.py [--repeats 5] [--cache DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "agents"))  # the scripted-dialogue helpers

import common  # noqa: E402
import tunix_agentic  # noqa: E402
import tunix_side  # noqa: E402
from matpo_jax import tools  # noqa: E402
from matpo_jax.agents import prompts  # noqa: E402
from matpo_jax.agents.rollout import EngineOptions, run_rollouts  # noqa: E402
from matpo_jax.chat import ChatFormat, format_tool_call  # noqa: E402
from matpo_jax.chat.tokenizer_training import train_tokenizer  # noqa: E402
from matpo_jax.config import RolloutSection  # noqa: E402
from matpo_jax.model import load_pretrained, save_pretrained  # noqa: E402
from matpo_jax.tools.search_server import SearchServer  # noqa: E402
from scripted_agents import (CORPUS, PlannerScript, SingleScript, WorkerScript, fit,  # noqa: E402
                             planner_conversation, single_conversation, tiny_model,
                             worker_conversation)

RESULTS = ROOT / "benchmarks" / "results"

# ------------------------------------------------------------------------------------ workload
# Reasoning before each tool call (rollout.py's short workload): decoding is then a real part of
# a turn, as with reasoning models (which think for hundreds of tokens).
THINK = ("<think>\nI need facts from the pages before I write anything. I will use one tool at a "
         "time, read what comes back, and check it against the task before the next step.\n"
         "</think>\n\n")
SCRIPTS = [  # 1 to 3 tool calls: rollouts of one batch end at different turns
    SingleScript("Where was Ada Lovelace born?",
                 (("search", {"query": "Ada Lovelace born"}),), "\\boxed{London}"),
    SingleScript("Where was Alan Turing born?",
                 (("search", {"query": "Alan Turing born"}), ("open", {"id": "d2"})),
                 "\\boxed{Maida Vale}"),
    SingleScript("Where was Grace Hopper born?",
                 (("search", {"query": "Grace Hopper born"}), ("open", {"id": "d3"})),
                 "\\boxed{New York}"),
    SingleScript("Where were Ada Lovelace and Alan Turing born?",
                 (("search", {"query": "pioneer born"}), ("open", {"id": "d1"}),
                  ("open", {"id": "d2"})), "\\boxed{London and Maida Vale}"),
]
# MATPO mode: each planner hands its question's search loop to one worker, then answers.
PLANNERS = [
    PlannerScript(s.question, (WorkerScript(
        subtask=f"Find out: {s.question}", calls=s.calls, answer=s.answer.replace(
            "\\boxed{", "").rstrip("}") + ".",
        summary=f"Found: {s.answer.replace(chr(92) + 'boxed{', '').rstrip('}')}. "
                f"Sources: {', '.join(a['id'] for n, a in s.calls if n == 'open') or 'search'}."),),
        s.answer)
    for s in SCRIPTS
]
GROUP_SIZE = 4
MAX_TURNS = 1 + max(len(s.calls) for s in SCRIPTS)  # every script ends by its answer
MAX_NEW_TOKENS = 96  # per turn, both sides
MAX_CONTEXT = 1024  # ours; tunix's prompt and cache lengths: see tunix_lengths
VOCAB = 1024
# Qwen3 fields (rope_theta: the default 1e6, what tunix 0.1.7's Qwen3 uses whatever its config
# says). Only the tests' tiny shape: it fits in minutes; larger shapes were not run.
SIZES = {
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=16),
}
FIT_LR = {"tiny": 2e-2}
FIT_STEPS = 4000  # the fit stops as soon as greedy replays every scripted turn


def rollout_config(mode: str) -> RolloutSection:
    return RolloutSection(
        mode=mode, group_size=GROUP_SIZE, decode_slots=len(SCRIPTS) * GROUP_SIZE,
        max_context=MAX_CONTEXT, max_new_tokens_per_turn=MAX_NEW_TOKENS,
        max_turns_planner=MAX_TURNS, max_turns_worker=MAX_TURNS, temperature=0.0)


def engine_options() -> EngineOptions:
    return EngineOptions(injection_buckets=tuple(
        b for b in (32, 64, 128, 256, 512) if b < MAX_CONTEXT) + (MAX_CONTEXT,))


def with_think(conversation: list[dict]) -> list[dict]:
    """Every tool-call turn reasons first."""
    return [dict(m, content=THINK + m["content"]) if m["role"] == "assistant"
            and "<tool_call>" in m["content"] else m for m in conversation]


def scripted_response(script: SingleScript, turn: int) -> str:
    if turn < len(script.calls):
        return THINK + format_tool_call(*script.calls[turn])
    return script.answer


# ------------------------------------------------------------------- the shared checkpoint
def tunix_turns(toolbox, parser, roundtrip=lambda text: text) -> list[tuple[str, str]]:
    """(prompt text, response text) of every model call tunix's agentic path makes on the
    scripts, recorded with a scripted model call in its own agent/env/engine."""
    by_question = {prompts.question_prompt(s.question): s for s in SCRIPTS}
    teacher = tunix_agentic.ScriptedModelCall(
        parser, lambda question, turn: scripted_response(by_question[question], turn), roundtrip)
    pairs = tunix_agentic.make_pairs(list(by_question), 1, prompts.SINGLE_ROLE,
                                     tunix_agentic.tool_map(toolbox), MAX_TURNS)
    tunix_agentic.collect(pairs, teacher, 1, len(pairs), mode="Conversation")
    return sorted(teacher.turns)  # arrival order varies; the fit and its cache key must not


def fit_data(toolbox):
    """(tokenizer, sequences): our single-agent, planner and worker dialogues as our engine
    assembles them, and tunix's per-turn (prompt, response) pairs as its agent renders them."""
    run_tool = lambda name, arguments: toolbox.call(name, arguments).text  # noqa: E731
    ours = [with_think(single_conversation(s, run_tool)) for s in SCRIPTS]
    for p in PLANNERS:
        ours.append(planner_conversation(p, RolloutSection().report_max_chars))
        ours += [with_think(worker_conversation(p.question, w, run_tool)) for w in p.workers]

    class _Names:  # what QwenChatTemplateParser reads off a tokenizer, before one exists
        bos_token, eos_token = None, "<|im_end|>"
    draft = tunix_turns(toolbox, tunix_agentic.chat_parser(_Names()))
    texts = [m["content"] for c in ours for m in c] + [t for turn in draft for t in turn]
    hf = train_tokenizer(texts * 4, VOCAB)
    chat = ChatFormat(hf)
    # Recorded again with the real tokenizer: the sampler returns decode(ids), the text the
    # agent keeps, so the prompts fitted are byte for byte those tunix will build.
    turns = tunix_turns(toolbox, tunix_agentic.chat_parser(hf), roundtrip(hf))
    sequences = [chat.render(c) for c in ours]
    for prompt, response in turns:
        prompt_ids = list(hf.encode(prompt))  # as tunix's Sampler.tokenize (no BOS: none set)
        response_ids = list(hf.encode(response, add_special_tokens=False)) + [chat.im_end_id]
        sequences.append((prompt_ids + response_ids,
                          [False] * len(prompt_ids) + [True] * len(response_ids)))
    return hf, sequences


def roundtrip(hf):
    return lambda text: hf.decode(hf.encode(text, add_special_tokens=False))


def checkpoint(toolbox, size: str, cache_root: str | None) -> tuple[str, dict]:
    """The fitted checkpoint directory (weights + tokenizer), fitted now or, when `cache_root`
    holds one fitted on exactly these sequences and settings, reused from there."""
    import hashlib
    hf, sequences = fit_data(toolbox)
    key = hashlib.sha256(json.dumps([sequences, SIZES[size], FIT_LR[size], FIT_STEPS, VOCAB,
                                     hf.get_vocab()], sort_keys=True).encode()).hexdigest()[:16]
    root = cache_root or tempfile.mkdtemp(prefix="peers_rollout_")
    path = os.path.join(root, f"{size}-{key}")
    info = dict(sequences=len(sequences), longest=max(len(ids) for ids, _ in sequences),
                trainable_tokens=int(sum(sum(t) for _, t in sequences)), key=key)
    done = os.path.join(path, "fit.json")
    if os.path.exists(done):
        info.update(json.load(open(done)), reused=True)
        return path, info
    start = time.perf_counter()
    chat = ChatFormat(hf)
    model = tiny_model(chat.id_count, max_position_embeddings=4096, **SIZES[size])
    graphdef, state, margin = fit(model, sequences, max_steps=FIT_STEPS,
                                  learning_rate=FIT_LR[size])
    if margin < 1.0:
        raise RuntimeError(f"the fit stopped at margin {margin:.2f} < 1: greedy may not replay")
    from flax import nnx
    save_pretrained(nnx.merge(graphdef, state), path)
    hf.save_pretrained(path)
    fitted = dict(fit_s=time.perf_counter() - start, margin=float(margin))
    with open(done, "w") as f:
        json.dump(fitted, f)
    info.update(fitted, reused=False)
    return path, info


# ------------------------------------------------------------------------------- the sides
class ServerCounts:
    """Counts the requests the search service answers: /search (the index's search) and
    /page (its id lookup). Wraps the live index object the handler threads read."""

    def __init__(self, server):
        self._lock = threading.Lock()
        self.search = self.page = 0
        index = server.index
        search, by_id = index.search, index.by_id
        counts = self

        class _Pages(dict):
            def get(self, key, default=None):
                with counts._lock:
                    counts.page += 1
                return super().get(key, default)

        def counted_search(*a, **k):
            with self._lock:
                self.search += 1
            return search(*a, **k)

        index.search, index.by_id = counted_search, _Pages(by_id)

    def take(self) -> dict:
        with self._lock:
            out, self.search, self.page = dict(search=self.search, page=self.page), 0, 0
        return out


def strip_end(text: str) -> str:
    return text[:-len("<|im_end|>")] if text.endswith("<|im_end|>") else text


class Ours:
    def __init__(self, path: str, toolbox):
        from flax import nnx
        self.graphdef, self.state = nnx.split(load_pretrained(path))
        self.chat = ChatFormat.from_pretrained(path)
        self.toolbox = toolbox

    def run(self, mode: str):
        return run_rollouts(self.state, self.graphdef, self.chat, self.toolbox,
                            [s.question for s in SCRIPTS], rollout_config(mode),
                            jax.random.key(0), engine_options())

    def check(self, batch, mode: str, roundtrip) -> None:
        """Greedy replays the scripts: every rollout answers, with the scripted turns."""
        assert all(r.finish_reason == "answer" for r in batch.rollouts), \
            [r.finish_reason for r in batch.rollouts]
        top = [r for r in batch.rollouts if r.role != "worker"]
        assert len(top) == len(SCRIPTS) * GROUP_SIZE
        for r in top:
            script = SCRIPTS[r.query_index]
            if mode == "single":
                want = [scripted_response(script, t) for t in range(len(script.calls) + 1)]
                got = [strip_end(t) for t in r.assistant_texts]
                assert got == [roundtrip(w) for w in want], (got, want)
            else:
                planner = PLANNERS[r.query_index]
                children = batch.children(r)
                assert len(children) == len(planner.workers)
                assert strip_end(r.assistant_texts[-1]) == planner.answer


def tunix_lengths() -> tuple[int, int]:
    """(max_prompt_length, cache size) of tunix's sampler: the same context budget as ours (a
    prompt of up to max_context - max_new_tokens, a cache of max_context), one compiled shape
    (a prompt longer than max_prompt_length would be padded to the next power of two instead,
    with a new compilation)."""
    return MAX_CONTEXT - MAX_NEW_TOKENS, MAX_CONTEXT


class Tunix:
    def __init__(self, path: str, toolbox, follow_budget: bool = False):
        from transformers import AutoTokenizer
        from tunix.rl.rollout.base_rollout import RolloutConfig
        self.hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
        chat = ChatFormat(self.hf)
        self.parser = tunix_agentic.chat_parser(self.hf)
        self.tools = tunix_agentic.tool_map(toolbox)
        prompt_len, cache = tunix_lengths()
        self.response_budget = None
        if follow_budget:  # as AgenticRLLearner: max_tokens_to_generate == max_response_length
            self.response_budget = MAX_CONTEXT - max(tunix_agentic_first_prompt_lengths(self))
            prompt_len, cache = MAX_CONTEXT, MAX_CONTEXT + self.response_budget
        self.rollout = tunix_agentic.make_rollout(tunix_side.load(path), self.hf, cache)
        config = RolloutConfig(
            max_tokens_to_generate=self.response_budget or MAX_NEW_TOKENS,
            max_prompt_length=prompt_len, kv_cache_size=cache, temperature=0.0, top_p=None,
            top_k=None, eos_tokens=list(chat.stop_ids), return_logprobs=True)
        self.model_call = tunix_agentic.ModelCall(self.rollout, self.parser, config,
                                                  follow_budget=follow_budget)
        self.prompt_len, self.cache = prompt_len, cache

    def run(self):
        self.model_call.reset()
        pairs = tunix_agentic.make_pairs([prompts.question_prompt(s.question) for s in SCRIPTS],
                                         GROUP_SIZE, prompts.SINGLE_ROLE, self.tools, MAX_TURNS)
        start = time.perf_counter()
        items = tunix_agentic.collect(pairs, self.model_call, GROUP_SIZE, len(pairs),
                                      tokenizer=self.hf, parser=self.parser,
                                      max_response_length=self.response_budget)
        wall = time.perf_counter() - start
        return items, wall, list(self.model_call.calls)

    def check(self, items, roundtrip) -> None:
        assert len(items) == len(SCRIPTS) * GROUP_SIZE
        by_question = {prompts.question_prompt(s.question): s for s in SCRIPTS}
        for item in items:
            traj = item.traj
            assert traj["status"] == "SUCCEEDED", traj["status"]
            script = by_question[traj["original_input"]["question"]]
            want = [roundtrip(scripted_response(script, t)) for t in range(len(script.calls) + 1)]
            assert tunix_agentic.assistant_texts(item) == want, tunix_agentic.assistant_texts(item)

    def compiled_shapes(self) -> int:
        sampler = self.rollout._sampler  # noqa: SLF001 - how many programs its jits hold
        return int(sampler._compiled_decode_fn._cache_size())  # noqa: SLF001


def tunix_agentic_first_prompt_lengths(side) -> list[int]:
    """Token lengths of the first-turn prompts tunix renders (system + tools prompt + question)."""
    out = []
    for s in SCRIPTS:
        agent = tunix_agentic.make_pairs([prompts.question_prompt(s.question)], 1,
                                         prompts.SINGLE_ROLE, side.tools, MAX_TURNS)[0][0]
        agent.update_from_env({"question": prompts.question_prompt(s.question)}, 0.0, False, {})
        text = side.parser.parse(agent.chat_completions, add_generation_prompt=True,
                                 is_first_msg=True)
        out.append(len(side.hf.encode(text)))
    return out


def ours_metrics(batch, tool_requests: dict) -> dict:
    m = batch.metrics
    out = {k: float(m[k]) for k in ("rollouts_per_s", "wall_time_s", "slot_utilisation",
                                    "decode_steps", "host_calls", "sampled_tokens",
                                    "prefill_tokens", "extend_positions")}
    out["rows_per_decode_step"] = m["sampled_tokens"] / max(1, m["decode_steps"])
    calls = [c for r in batch.rollouts for c in r.tool_calls]
    out["tool_calls"] = sum(c.name in ("search", "open") for c in calls)
    out["subagent_calls"] = sum(c.name == "subagent" for c in calls)
    out["rollouts"] = sum(r.role != "worker" for r in batch.rollouts)
    out["worker_rollouts"] = sum(r.role == "worker" for r in batch.rollouts)
    out["server_requests"] = tool_requests
    return out


def tunix_metrics(items, wall: float, calls, tool_requests: dict, side: Tunix) -> dict:
    busy = sum(c.end - c.start for c in calls)
    sampled = sum(c.sampled for c in calls)
    return dict(
        rollouts_per_s=len(items) / wall, wall_time_s=wall, rollouts=len(items),
        model_calls=len(calls), sampled_tokens=sampled,
        # each call is one row: a prefill that samples the first token, then one batch-1
        # forward per further token, over the whole cache
        decode_steps=sampled - len(calls), rows_per_decode_step=1.0,
        prompt_tokens=sum(c.prompt_tokens for c in calls),
        prefill_positions=sum(c.padded_prompt for c in calls),
        calls_in_flight=busy / wall,  # time-average of concurrent model calls
        cache_positions_per_step=side.cache,
        tool_calls=sum(tunix_agentic.tool_messages(i) for i in items),
        server_requests=tool_requests)


# ------------------------------------------------------------------------------ cross-check
def cross_check(ours: Ours, tunix: Tunix) -> dict:
    """Same weights, same numerics: on each script's first-turn prompt, as tunix's agent renders
    it and as our engine writes it, tunix's sampler (VanillaRollout at batch 1, as its agentic
    path calls it) and ours (`generate`) produce the same greedy turn with the same log-probs."""
    from matpo_jax.sampler.loop import Sampling, generate
    hf, chat = tunix.hf, ours.chat
    rows = []
    for s in SCRIPTS:
        question = prompts.question_prompt(s.question)
        agent = tunix_agentic.make_pairs([question], 1, prompts.SINGLE_ROLE, tunix.tools,
                                         MAX_TURNS)[0][0]
        agent.update_from_env({"question": question}, 0.0, False, {})
        tunix_text = tunix.parser.parse(agent.chat_completions, add_generation_prompt=True,
                                        is_first_msg=True)
        our_ids = chat.prompt_ids([
            {"role": "system", "content": chat.system_prompt(
                prompts.SINGLE_ROLE, [tools.SEARCH_SCHEMA, tools.OPEN_SCHEMA])},
            {"role": "user", "content": question}])
        for origin, ids in (("tunix", list(hf.encode(tunix_text))), ("ours", our_ids)):
            text = hf.decode(ids)
            assert list(hf.encode(text)) == list(ids), "the prompt does not round-trip"
            mine, my_logprobs = generate(ours.state, ours.graphdef, [ids], MAX_NEW_TOKENS,
                                         Sampling(greedy=True), stop_ids=chat.stop_ids)
            mine, my_logprobs = list(mine[0]), np.asarray(my_logprobs[0], np.float64)
            out = tunix.rollout.generate([text], tunix.model_call.config)
            theirs = [int(t) for t in out.tokens[0]]
            their_logprobs = np.asarray(out.logprobs[0], np.float64)
            stop = mine[-1] in chat.stop_ids
            same = mine[:len(mine) - stop] == theirs
            rows.append(dict(script=s.question, prompt=origin, prompt_tokens=len(ids),
                             tokens=len(theirs), same_tokens=bool(same),
                             max_logprob_diff=float(np.max(np.abs(
                                 my_logprobs[:len(theirs)] - their_logprobs[:len(theirs)])))
                             if same and theirs else None,
                             first_call=hf.decode(theirs)[-80:]))
    return dict(rows=rows, all_same=all(r["same_tokens"] for r in rows))


# ------------------------------------------------------------------------------------ main
ARMS = ("ours_single", "tunix", "ours_matpo")


def run_arm(name, ours, tunix, counts, rt):
    """One checked run of an arm -> its metrics (server requests answered during it)."""
    if name == "tunix":
        items, wall, calls = tunix.run()
        tunix.check(items, rt)
        return tunix_metrics(items, wall, calls, counts.take(), tunix)
    mode = name.split("_")[1]
    batch = ours.run(mode)
    ours.check(batch, mode, rt)
    return ours_metrics(batch, counts.take())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/matpo_jax/peers_rollout"),
                        help="where fitted checkpoints are kept and reused ('' : fit afresh)")
    parser.add_argument("--no-budget-arm", action="store_true",
                        help="skip tunix configured as AgenticRLLearner does (remaining budget)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    from importlib.metadata import version
    started, load_before = time.perf_counter(), common.load_average()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = pathlib.Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
        with SearchServer(corpus) as server:
            counts = ServerCounts(server)
            toolbox = tools.worker_toolbox(server.url)
            path, fit_info = checkpoint(toolbox, args.size, args.cache or None)
            print("checkpoint", path, fit_info, flush=True)
            counts.take()
            ours, tunix = Ours(path, toolbox), Tunix(path, toolbox)
            rt = roundtrip(tunix.hf)
            cross = cross_check(ours, tunix)
            print("cross-check", json.dumps(cross, indent=1), flush=True)
            first_call, runs = {}, {name: [] for name in ARMS}
            for name in ARMS:  # warm-up: compiles, and checks the work
                start = time.perf_counter()
                warm = run_arm(name, ours, tunix, counts, rt)
                first_call[name] = time.perf_counter() - start
                print(f"[warm-up] {name}: {first_call[name]:.1f}s", flush=True)
            tunix_shapes_warm = tunix.compiled_shapes()
            for repeat in range(args.repeats):  # interleaved: every arm sees the same load
                for name in ARMS:
                    runs[name].append(run_arm(name, ours, tunix, counts, rt))
                print(f"[repeat {repeat}] " + ", ".join(
                    f"{n} {runs[n][-1]['rollouts_per_s']:.2f}/s" for n in ARMS),
                    common.load_average(), flush=True)
            profile = tunix_agentic.profile_calls(
                tunix.rollout, [p for p, _ in tunix_turns(toolbox, tunix.parser, rt)],
                tunix.model_call.config)
            counts.take()
            print("tunix call profile", profile, flush=True)
            budget = None if args.no_budget_arm else budget_arm(path, toolbox, counts, rt)
            tunix_shapes = tunix.compiled_shapes()
    result = summarise(runs, first_call, cross, budget, fit_info, args)
    result["tunix_call_profile"] = profile
    result.update(
        command="make bench-peers  # python benchmarks/peers/rollout_bench.py " +
                " ".join(sys.argv[1:]),
        environment=dict(jax=jax.__version__, tunix=version("google-tunix"),
                         cpu=platform.processor() or platform.machine(), cores=os.cpu_count(),
                         load_before=load_before, load_after=common.load_average(),
                         machine_shared=True),
        tunix_compiled_shapes=dict(after_warmup=tunix_shapes_warm, after_repeats=tunix_shapes),
        total_s=time.perf_counter() - started)
    common.write_results(args.out, "peers_rollout", result, markdown(result))
    print(markdown(result))


def budget_arm(path, toolbox, counts, rt) -> dict:
    """tunix as AgenticRLLearner configures it: max_tokens_to_generate == max_response_length,
    and each model call samples up to the trajectory's remaining response budget (the engine's
    max_generation_steps replaces it, RLCluster.generate): every distinct remaining budget is a
    new token-buffer shape, so a new prefill + decode compilation. A fresh sampler: the first run
    pays them all, the second (same greedy lengths) none."""
    side = Tunix(path, toolbox, follow_budget=True)
    out = dict(response_budget=side.response_budget, max_prompt_length=side.prompt_len,
               cache=side.cache)
    for label in ("first_run", "second_run"):
        start = time.perf_counter()
        metrics = run_arm("tunix", None, side, counts, rt)
        out[label] = dict(wall_s=time.perf_counter() - start,
                          rollouts_per_s=metrics["rollouts_per_s"],
                          compiled_shapes=side.compiled_shapes())
        print(f"[budget arm] {label}: {out[label]}", flush=True)
    return out


def summarise(runs, first_call, cross, budget, fit_info, args) -> dict:
    medians = {name: {k: statistics.median(r[k] for r in rs) for k, v in rs[0].items()
                      if isinstance(v, (int, float))} for name, rs in runs.items()}
    ours, theirs, matpo = runs["ours_single"], runs["tunix"], runs["ours_matpo"]
    per_repeat = [o["rollouts_per_s"] / t["rollouts_per_s"] for o, t in zip(ours, theirs)]
    same_work = dict(
        server_requests=all(o["server_requests"] == t["server_requests"] == m["server_requests"]
                            for o, t, m in zip(ours, theirs, matpo)),
        tool_calls=all(o["tool_calls"] == t["tool_calls"] for o, t in zip(ours, theirs)),
        sampled_tokens_single_vs_tunix=all(o["sampled_tokens"] == t["sampled_tokens"]
                                           for o, t in zip(ours, theirs)))
    ratio = dict(median_of_ratios=statistics.median(per_repeat),
                 ratio_of_medians=(medians["ours_single"]["rollouts_per_s"]
                                   / medians["tunix"]["rollouts_per_s"]),
                 per_repeat=per_repeat, bar=2.0)
    ratio["bar_met"] = ratio["median_of_ratios"] >= ratio["bar"]
    prompt_len, cache = tunix_lengths()
    return dict(
        benchmark="multi-turn tool rollouts: tunix agentic path vs ours (single, MATPO)",
        settings=dict(size=args.size, params=SIZES[args.size], questions=len(SCRIPTS),
                      group_size=GROUP_SIZE, max_turns=MAX_TURNS,
                      max_new_tokens_per_turn=MAX_NEW_TOKENS, max_context=MAX_CONTEXT,
                      decode_slots=len(SCRIPTS) * GROUP_SIZE,
                      tunix_max_concurrency=len(SCRIPTS) * GROUP_SIZE,
                      tunix_executor_threads=min(32, (os.cpu_count() or 1) + 4),
                      tunix_max_prompt_length=prompt_len, tunix_cache_size=cache,
                      tool_calls_per_script=[len(s.calls) for s in SCRIPTS], repeats=args.repeats,
                      decoding="greedy", timing="median of interleaved repeats after a warm-up"),
        fit=fit_info, cross_check=cross, same_work=same_work, first_call_s=first_call,
        medians=medians, ratio_ours_single_over_tunix=ratio,
        matpo_over_single=medians["ours_matpo"]["rollouts_per_s"]
        / medians["ours_single"]["rollouts_per_s"],
        budget_arm=budget, runs=runs)


def markdown(result) -> str:
    s, env, med = result["settings"], result["environment"], result["medians"]
    ratio, cross = result["ratio_ours_single_over_tunix"], result["cross_check"]
    o, t, m = med["ours_single"], med["tunix"], med["ours_matpo"]
    lines = [
        "# Multi-turn tool rollouts: tunix agentic path vs ours (same checkpoint, same questions)",
        "",
        f"`{result['command']}`. CPU ({env['cores']} cores, shared with other jobs: load average "
        f"{env['load_before']} before, {env['load_after']} after), jax {env['jax']}, tunix "
        f"{env['tunix']}. One Qwen3 ({s['size']}: {s['params']}) fitted to scripted search "
        "dialogues on both sides' contexts, saved once, loaded by each side's loader; greedy, so "
        f"every rollout replays its script. {s['questions']} questions x G={s['group_size']} = "
        f"{s['decode_slots']} rollouts, {s['tool_calls_per_script']} search/open calls per "
        f"question's script (each tool-call turn reasons ~45 tokens first), turn cap "
        f"{s['max_turns']}, {s['max_new_tokens_per_turn']} new tokens per turn, context "
        f"{s['max_context']}; one local search service (127.0.0.1, HTTP) and the same client on "
        f"both sides. Median of {s['repeats']} interleaved repeats after a warm-up.",
        "",
        "| | ours, mode single | tunix agentic (ToolAgent + ToolEnvironment + "
        "RolloutOrchestrator, native Sampler) | ours, MATPO (planner + worker) |",
        "|---|---:|---:|---:|",
        f"| rollouts / s | **{o['rollouts_per_s']:.2f}** | **{t['rollouts_per_s']:.2f}** | "
        f"{m['rollouts_per_s']:.2f} (planner rollouts) |",
        f"| wall time per batch (s) | {o['wall_time_s']:.2f} | {t['wall_time_s']:.2f} | "
        f"{m['wall_time_s']:.2f} |",
        f"| first call, compiles included (s) | {result['first_call_s']['ours_single']:.1f} | "
        f"{result['first_call_s']['tunix']:.1f} | {result['first_call_s']['ours_matpo']:.1f} |",
        f"| search/open calls (each one request the service answered) | {o['tool_calls']:.0f} "
        f"| {t['tool_calls']:.0f} | {m['tool_calls']:.0f} (+ {m['subagent_calls']:.0f} "
        "subagent calls) |",
        f"| tokens sampled | {o['sampled_tokens']:.0f} | {t['sampled_tokens']:.0f} | "
        f"{m['sampled_tokens']:.0f} |",
        f"| decode steps (forwards of the decode batch) | {o['decode_steps']:.0f} | "
        f"{t['decode_steps']:.0f} (batch-1, {t['model_calls']:.0f} calls) | "
        f"{m['decode_steps']:.0f} |",
        f"| rows per decode step | {o['rows_per_decode_step']:.1f} of {s['decode_slots']} | 1 | "
        f"{m['rows_per_decode_step']:.1f} of {s['decode_slots']} |",
        f"| decode-slot utilisation | {o['slot_utilisation']:.0%} | 100% of a 1-row batch; "
        f"{t['calls_in_flight']:.1f} calls in flight on average (of "
        f"{s['tunix_max_concurrency']} episodes, {s['tunix_executor_threads']} executor "
        f"threads) | {m['slot_utilisation']:.0%} |",
        f"| prompt positions computed | {o['extend_positions']:.0f} (injection writes, "
        f"{o['host_calls']:.0f} host calls) | {t['prefill_positions']:.0f} (prefills padded to "
        f"{s['tunix_max_prompt_length']}; {t['prompt_tokens']:.0f} real) | "
        f"{m['extend_positions']:.0f} |",
        f"| cache positions each decode step reads | the slot's length | "
        f"{s['tunix_cache_size']} | the slot's length |",
        "",
        f"Ours (single) / tunix rollouts/s: **{ratio['median_of_ratios']:.2f}x** (median of the "
        f"per-repeat ratios; ratio of medians {ratio['ratio_of_medians']:.2f}x; per repeat "
        + ", ".join(f"{r:.2f}" for r in ratio["per_repeat"]) + f"). Bar {ratio['bar']:.0f}x: "
        + ("met." if ratio["bar_met"] else "NOT met.") + f" MATPO mode / single: "
        f"{result['matpo_over_single']:.2f}x the rollouts/s, for "
        f"{m['worker_rollouts']:.0f} extra worker rollouts.",
        "",
        "Same work, checked every run: every trajectory replays its script on both sides; the "
        f"service answered the same requests for each arm: {result['same_work']}.",
        f"Cross-check (same weights, same numerics): on each question's first-turn prompt, as "
        f"tunix's agent renders it and as our engine writes it, tunix's sampler and ours give the "
        f"same greedy turn: {'yes' if cross['all_same'] else 'NO'} "
        f"({sum(r['same_tokens'] for r in cross['rows'])}/{len(cross['rows'])} prompts; "
        "largest log-prob difference "
        f"{max((r['max_logprob_diff'] or 0) for r in cross['rows']):.1e}).",
    ]
    prof = result.get("tunix_call_profile")
    if prof:
        lines += ["", f"Where a tunix model call's time goes ({prof['calls']} calls, the "
                  "prompts of one rollout per question, run one after another): "
                  f"{prof['ms_per_call']:.0f} ms per call = prefill "
                  f"{1e3 * prof['prefill_s'] / prof['calls']:.0f} ms (a "
                  f"{s['tunix_max_prompt_length']}-position prompt buffer) + decode "
                  f"{1e3 * prof['decode_s'] / prof['calls']:.0f} ms "
                  f"({prof['decode_ms_per_token']:.2f} ms per batch-1 step over a "
                  f"{s['tunix_cache_size']}-position cache) + host "
                  f"{1e3 * prof['host_s'] / prof['calls']:.0f} ms (tokenising the conversation, "
                  "the sampling state and a fresh cache built eagerly, fetching and "
                  "detokenising). Ours: "
                  f"{1e3 * o['wall_time_s'] / o['decode_steps']:.2f} ms of wall time per decode "
                  f"step of {o['rows_per_decode_step']:.1f} rows, everything included."]
    budget = result.get("budget_arm")
    if budget:
        lines += ["", "tunix configured as AgenticRLLearner does (max_tokens_to_generate = "
                  f"max_response_length = {budget['response_budget']}, each call sampling up to "
                  f"the remaining budget; max_prompt_length {budget['max_prompt_length']}, cache "
                  f"{budget['cache']}), fresh sampler: first run "
                  f"{budget['first_run']['wall_s']:.1f} s with "
                  f"{budget['first_run']['compiled_shapes']} compiled decode programs, second run "
                  f"{budget['second_run']['wall_s']:.1f} s "
                  f"({budget['second_run']['rollouts_per_s']:.2f} rollouts/s, "
                  f"{budget['second_run']['compiled_shapes']} programs)."]
    fit = result["fit"]
    lines += ["", f"The checkpoint: {fit['sequences']} fitted sequences (longest "
              f"{fit['longest']} tokens), margin {fit.get('margin', float('nan')):.2f}, fit "
              f"{fit.get('fit_s', float('nan')):.0f} s"
              + (" (reused from the cache)" if fit.get("reused") else "") + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
