"""Shared decode batching of planner and worker rollouts vs running the roles one after another.

Both arms run the same rollout engine over the same batch, model, search server and slots; the
only difference is `RolloutConfig.mix_roles`:
- mixed (ours): planner and worker sequences share the decode batch; a planner waiting on its
  workers gives up its slot and any waiting sequence of either role takes a free slot;
- phased (baseline): one role decodes at a time: all ready planner turns, then all ready workers
  (each runs its whole tool loop), then the planners again..., never mixing roles in a batch.

The policy is a tiny Qwen3 fitted to scripted dialogues (tests/agents_rollout/scripted_agents.py)
and decoded greedily, so both arms produce identical trajectories (checked) and do the same work.
Worker lengths vary the way real tool loops do: each planner delegates three subtasks in turn,
and in each round one question's worker reads every page (long) while the others do one search
(short) — a different question's worker is the long one in each round (a Latin square).

    .venv/bin/python benchmarks/rollout.py     # writes benchmarks/results/rollout.{json,md}
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "agents_rollout"))  # the scripted-policy helpers

from matpo_jax import sampling  # noqa: E402
from matpo_jax.agents import tools  # noqa: E402
from matpo_jax.agents.rollout import RolloutConfig, run_rollouts  # noqa: E402
from matpo_jax.agents.search_server import SearchServer  # noqa: E402
from scripted_agents import CORPUS, PlannerScript, WorkerScript, scripted_policy  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
REPEATS = 3

LONG = WorkerScript(
    subtask="Read every page about the three pioneers.",
    calls=(("search", {"query": "pioneer born"}), ("open", {"id": "d1"}),
           ("open", {"id": "d2"}), ("open", {"id": "d3"})),
    answer="London, Maida Vale and New York.",
    summary="Ada Lovelace was born in London, Alan Turing in Maida Vale and Grace Hopper in "
            "New York. Sources: d1, d2, d3.")
SHORT = WorkerScript(
    subtask="Find where Ada Lovelace was born.",
    calls=(("search", {"query": "Ada Lovelace born"}),),
    answer="London.",
    summary="Ada Lovelace was born in London. Source: d1.")
ROUNDS = 3
PLANNERS = [
    PlannerScript(question=f"Pioneer question number {q}: where were they born?",
                  workers=tuple(LONG if r == q else SHORT for r in range(ROUNDS)),
                  answer=f"\\boxed{{answer {q}}}")
    for q in range(ROUNDS)
]

# Workers reason before each tool call, as reasoning models do (so decoding, not prefill, is
# most of a worker's time, as in real deep-research rollouts).
THINK = ("<think>\nI need facts from the pages before I write anything. I will use one tool at a "
         "time, read what comes back, and check it against the task before the next step.\n"
         "</think>\n\n")
MAX_CONTEXT = 1024
CONFIG = RolloutConfig(
    mode="matpo", group_size=2, slots=12, max_context=MAX_CONTEXT, max_new_tokens=96,
    max_turns_planner=ROUNDS + 1, max_turns_worker=len(LONG.calls) + 1, report_max_chars=300,
    temperature=0.0, user_query_recap=False,  # recap off: workers are shared across questions
    injection_buckets=(32, 64, 128, 192, 256, 320, 384, 512, 768, MAX_CONTEXT))


def main() -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = pathlib.Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
        with SearchServer(corpus) as server:
            toolbox = tools.worker_toolbox(server.url)
            fit_start = time.perf_counter()
            # max_steps: the fit stops as soon as greedy replays the scripts; 400 steps (the
            # tests' default) is not always enough for this longer workload.
            policy = scripted_policy(PLANNERS, [], lambda n, a: toolbox.call(n, a).text,
                                     CONFIG.report_max_chars, user_query_recap=False, think=THINK,
                                     max_steps=1500)
            fit_s = time.perf_counter() - fit_start
            print(f"fitted the scripted policy in {fit_s:.1f}s (margin {policy.margin:.2f})")
            questions = [p.question for p in PLANNERS]
            arms = {"mixed": dataclasses.replace(CONFIG, mix_roles=True),
                    "phased": dataclasses.replace(CONFIG, mix_roles=False)}

            def run(cfg):
                return run_rollouts(policy.state, policy.graphdef, policy.chat, toolbox,
                                    questions, cfg, jax.random.key(0))

            warm = {name: run(cfg) for name, cfg in arms.items()}  # compile once, check work
            check_same_work(warm["mixed"], warm["phased"])
            runs = {name: [] for name in arms}
            for _ in range(REPEATS):  # interleaved, so both arms see the same machine load
                for name, cfg in arms.items():
                    runs[name].append(run(cfg).metrics)
    results = summarise(runs, warm["mixed"], fit_s, time.perf_counter() - started)
    write(results)


def check_same_work(a, b) -> None:
    """Greedy decoding: both arms must produce the very same trajectories (worker ids differ:
    they are numbered in spawn order, so workers are matched through their planner)."""
    def trajectories(batch):
        out = []
        for planner in batch.by_role("planner"):
            out.append((planner.tokens, planner.finish_reason))
            out.extend((w.tokens, w.finish_reason) for w in batch.children(planner))
        return out

    assert len(a.rollouts) == len(b.rollouts)
    assert trajectories(a) == trajectories(b), "the two arms did different work"
    assert all(r.finish_reason == "answer" for r in a.rollouts), "the policy left its script"


def summarise(runs, batch, fit_s: float, total_s: float) -> dict:
    def median(name, key):
        return statistics.median(m[key] for m in runs[name])

    arms = {}
    for name in runs:
        for metrics in runs[name]:
            metrics["decode_positions"] = CONFIG.slots * metrics["decode_steps"]
        arms[name] = {key: median(name, key) for key in (
            "decode_positions",
            "rollouts_per_s", "slot_utilisation", "wall_time_s", "decode_steps", "host_calls",
            "sampled_tokens", "prefill_tokens", "extend_positions", "evictions",
            "resumed_in_place")}
    return {
        "benchmark": "rollout: shared planner+worker decode batch vs roles one after another",
        "speedup_rollouts_per_s": (arms["mixed"]["rollouts_per_s"]
                                   / arms["phased"]["rollouts_per_s"]),
        "arms": arms,
        "batch": {"questions": len(PLANNERS), "group_size": CONFIG.group_size,
                  "planner_rollouts": batch.metrics["num_top_level"],
                  "worker_rollouts": batch.metrics["num_workers"], "slots": CONFIG.slots,
                  "max_context": CONFIG.max_context, "max_new_tokens": CONFIG.max_new_tokens,
                  "worker_tool_calls": {"long": len(LONG.calls), "short": len(SHORT.calls)}},
        "lanes": CONFIG.injection_lanes or sampling.default_lanes(CONFIG.slots),
        "repeats": REPEATS, "statistic": "median", "fit_s": fit_s, "total_s": total_s,
        "machine": {"platform": platform.platform(), "jax": jax.__version__,
                    "backend": jax.default_backend(), "cpus": os.cpu_count()},
    }


def write(results: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rollout.json").write_text(json.dumps(results, indent=2) + "\n")
    mixed, phased = results["arms"]["mixed"], results["arms"]["phased"]
    b = results["batch"]
    rows = [("planner rollouts / s", "rollouts_per_s", "{:.3f}"),
            ("slot utilisation (busy / total slot-steps)", "slot_utilisation", "{:.1%}"),
            ("wall time (s)", "wall_time_s", "{:.2f}"),
            ("decode steps", "decode_steps", "{:.0f}"),
            ("host calls", "host_calls", "{:.0f}"),
            ("sampled tokens", "sampled_tokens", "{:.0f}"),
            ("prefilled tokens (prompts + re-admissions)", "prefill_tokens", "{:.0f}"),
            ("decode positions computed (slots x decode steps)", "decode_positions", "{:.0f}"),
            ("injection positions computed (lanes x bucket, all host calls)", "extend_positions",
             "{:.0f}"),
            ("planners resumed in place / evicted", None, None)]
    lines = [
        "# Rollout: shared planner+worker decode batch vs roles one after another",
        "",
        f"One batch of {b['planner_rollouts']} planner rollouts ({b['questions']} questions x "
        f"G={b['group_size']}) spawning {b['worker_rollouts']} workers, {b['slots']} decode "
        f"slots, local BM25 search server over HTTP, tiny scripted Qwen3 decoded greedily (both "
        "arms produce identical trajectories). Each planner delegates 3 subtasks in turn; per "
        f"round one question's workers make {b['worker_tool_calls']['long']} tool calls, the "
        f"others {b['worker_tool_calls']['short']}. Median of {results['repeats']} interleaved "
        f"runs on {results['machine']['backend']} ({results['machine']['cpus']} cores).",
        "",
        "| | mixed (shared batch) | phased (roles one after another) |",
        "|---|---|---|",
    ]
    for label, key, fmt in rows:
        if key is None:
            cells = [f"{arm['resumed_in_place']:.0f} / {arm['evictions']:.0f}"
                     for arm in (mixed, phased)]
        else:
            cells = [fmt.format(arm[key]) for arm in (mixed, phased)]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    steps_ratio = phased["decode_steps"] / mixed["decode_steps"]
    lines += [
        "", f"**Speed-up (rollouts/s): {results['speedup_rollouts_per_s']:.2f}x** "
        f"(decode steps: {steps_ratio:.2f}x fewer with the shared batch)", "",
        "Reading the table: mixing roles removes the phase barriers (a planner whose worker is "
        "done decodes on while other questions' long workers still run), so the same tokens "
        "take fewer decode steps. The wall clock also pays the sampler's injection writes "
        "(prompts, tool responses, reports): a host call extends only the slots it writes into, "
        f"{results['lanes']} row(s) at a time (`injection_lanes`), by the smallest bucket that "
        "fits its longest write; the extend's attention reads only the filled part of the cache "
        "and only each row's last position is projected to the vocabulary. The shared batch "
        "admits workers as they are spawned, spread over more host calls; as the writes are "
        "per row, that no longer multiplies the injection work (compare the injection "
        "positions of the two arms). On a shared machine the ratio moves by about +-0.1 between "
        "runs: the remaining non-decode time (host calls, tool HTTP, injection) is alike in both "
        "arms.", "",
        "Reproduce: `.venv/bin/python benchmarks/rollout.py`.", ""]
    (RESULTS / "rollout.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
