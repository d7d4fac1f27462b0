"""SFT proxy for the embedded default: train SFT only, then measure on oracle demonstrations of
validation questions the teacher-forced copy-token accuracy and turn exact match per kind of turn,
and (NEVAL > 0) greedy accuracy of real rollouts. See docs/embedded_default.md.

    TFDS=/tmp/tfds NEVAL=96 python benchmarks/sft_proxy.py TAG "sft.copy_every=4,sft.steps=2000"

Writes benchmarks/results/sft_proxy/TAG/result.json (and the run's SFT checkpoints there).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from matpo_jax.report import metrics as metrics_lib  # noqa: E402
from matpo_jax.tools.search_server import SearchServer  # noqa: E402
from matpo_jax.config import load_config_file, to_typed  # noqa: E402
from matpo_jax.data import loader as loader_lib  # noqa: E402
from matpo_jax.data.oracle import Imperfection, Oracle, default_prompts  # noqa: E402
from matpo_jax.run.eval.registry import evaluate_with, run_policy  # noqa: E402
from matpo_jax.run.eval.world import WorldEvaluator  # noqa: E402
from matpo_jax.run.rl import model_state  # noqa: E402
from matpo_jax.run.runtime import Runtime, build_model, make_mesh, make_toolbox  # noqa: E402
from matpo_jax.run.sft import build_sft_sequences, run_sft, tool_text  # noqa: E402
from matpo_jax.data.sft_data import copy_token_mask  # noqa: E402
from matpo_jax.data.task_assets import prepare_task  # noqa: E402
from matpo_jax.data.world_assets import question_from_record  # noqa: E402

VALIDATION_QUESTIONS = 64  # oracle demonstrations scored teacher-forced
ROWS = 8  # demonstrations per forward pass


def main() -> None:
    tag, override = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
    neval = int(os.environ.get("NEVAL", "32"))
    cfg = to_typed(load_config_file(os.path.join(REPO, "configs", "synthetic_tiny.py"),
                                    override or None))
    work = os.path.join(REPO, "benchmarks", "results", "sft_proxy", tag)
    os.makedirs(work, exist_ok=True)
    out = {"tag": tag, "override": override}
    started = time.time()
    assets = prepare_task(cfg, os.environ.get("TFDS", "/tmp/matpo_tfds"))
    with SearchServer(assets.corpus_path) as server:
        rt = Runtime(cfg=cfg, workdir=work, mesh=make_mesh(cfg), assets=assets, chat=assets.chat,
                     toolbox=make_toolbox(cfg.tools, server.url))
        seqs = build_sft_sequences(rt)
        lengths = [len(s) for s in seqs]
        out.update(prep_s=time.time() - started, num_seqs=len(seqs),
                   mean_len=float(np.mean(lengths)), max_len=int(max(lengths)),
                   trainable_frac=float(np.mean(np.concatenate([s.trainable for s in seqs]))))
        print("prep", out, flush=True)
        cpu, wall = time.process_time(), time.time()
        graphdef, state = run_sft(rt, build_model(cfg, rt.mesh),
                                  metrics_lib.MetricsWriter(work, enabled=False))
        out.update(train_wall_s=time.time() - wall, train_cpu_s=time.process_time() - cpu)
        print("train", out["train_wall_s"], out["train_cpu_s"], flush=True)
        params = model_state(state)
        tokens, turns = teacher_forced(rt, graphdef, params, validation_demonstrations(rt))
        out["tok"], out["tf"] = tokens, turns
        print("tok", tokens, flush=True)
        print("teacher-forced", turns, flush=True)
        if neval > 0:
            rt.cfg = cfg.replace(eval=dataclasses.replace(cfg.eval, num_questions=neval))
            wall = time.time()
            metrics = evaluate_with(rt, "greedy", [WorldEvaluator(rt)],
                                    run_policy(rt, graphdef, params))
            out["eval_s"] = time.time() - wall
            out["eval"] = {k: round(v, 3) for k, v in metrics.items() if "accuracy" in k
                           or k in ("eval/answered", "eval/tool_calls_per_question")}
            print("eval", out["eval"], flush=True)
    with open(os.path.join(work, "result.json"), "w") as f:
        json.dump(out, f, indent=1)
    print("RESULT", json.dumps(out))


def validation_demonstrations(rt) -> list[tuple[str, int, list[dict]]]:
    """(role, hops, messages) of the oracle's solved demonstrations of validation questions."""
    cfg = rt.cfg
    source = loader_lib.open_source(rt.assets.config, rt.assets.data_dir)["validation"]
    records = [loader_lib.decode_record(source[i])
               for i in range(min(len(source), VALIDATION_QUESTIONS))]
    chars = int(cfg.tools.max_response_chars)
    oracle = Oracle(tool_text(rt.toolbox, "search", chars), tool_text(rt.toolbox, "open", chars),
                    role_prompts=default_prompts(int(cfg.rollout.report_max_chars)),
                    imperfection=Imperfection(), num_results=int(cfg.tools.num_results), seed=1,
                    fact_style=str(cfg.data.fact_style))
    conversations = []
    for question in map(question_from_record, records):
        demo = oracle.planner(question)
        if not demo.solved:
            continue
        conversations.append(("planner", question.num_hops, demo.messages))
        conversations += [("worker", question.num_hops, w.messages) for w in demo.workers]
    return conversations


def teacher_forced(rt, graphdef, params, conversations) -> tuple[dict, dict]:
    """Per kind of turn: token accuracy (and copy vs other tokens) and whole-turn exact match of
    the greedy next-token prediction under teacher forcing."""
    max_len = int(rt.cfg.rl.pack_len)

    @jax.jit
    def predict(params, tokens):
        return jnp.argmax(nnx.merge(graphdef, params)(tokens), -1)

    turn_hits, token_hits = collections.defaultdict(list), collections.defaultdict(list)
    for start in range(0, len(conversations), ROWS):
        chunk = conversations[start:start + ROWS]
        rendered = [rt.chat.render(messages) for _, _, messages in chunk]
        tokens = np.zeros((ROWS, max_len), np.int32)
        for row, (ids, _) in enumerate(rendered):
            tokens[row, :min(max_len, len(ids))] = ids[:max_len]
        predicted = np.asarray(predict(params, jnp.asarray(tokens)))
        for row, ((role, hops, messages), (ids, trainable)) in enumerate(zip(chunk, rendered)):
            ids, trainable = np.asarray(ids[:max_len]), np.asarray(trainable[:max_len])
            prompt_end = int(np.flatnonzero(ids == rt.chat.im_end_id)[0]) + 1
            copies = copy_token_mask(ids, trainable, prompt_end)
            hit = np.zeros(len(ids), bool)
            hit[1:] = predicted[row, :len(ids) - 1] == ids[1:]
            token_hits["COPY"] += hit[copies].tolist()
            token_hits["NONCOPY"] += hit[trainable & ~copies].tolist()
            texts = [m["content"] for m in messages if m["role"] == "assistant"]
            for (a, b), text in zip(_trainable_runs(trainable), texts):
                turn = hit[a:b]
                kinds = [_turn_kind(role, text)]
                if kinds[0] == "p_answer":
                    kinds.append(f"p_answer_h{hops}")
                for kind in kinds:
                    turn_hits[kind].append(bool(np.all(turn)))
                    token_hits[kind] += turn.tolist()

    def rounded(table):
        return {k: round(float(np.mean(v)), 3) for k, v in sorted(table.items())}

    return rounded(token_hits), rounded(turn_hits)


def _trainable_runs(trainable: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of trainable tokens: the assistant turns."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], trainable.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def _turn_kind(role: str, text: str) -> str:
    if role == "planner":
        return "p_answer" if "boxed" in text else "p_subtask"
    if '"search"' in text:
        return "w_search"
    if '"open"' in text:
        return "w_open"
    return "w_report" if text.startswith("Conclusion") else "w_fact"


if __name__ == "__main__":
    main()
