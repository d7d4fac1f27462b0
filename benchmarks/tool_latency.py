"""Slow tools: rollouts that wait for every tool call vs tools run in the background.

A remote search API answers in hundreds of milliseconds. With `rollout.async_tools=False`
a host call runs the tool calls of the turns that just ended and the whole decode batch waits for
them; with `async_tools=True` the calls run in the background, each waiting agent gives up its
slot, and the batch decodes on. Same engine, batch, scripted policy and workload as
benchmarks/rollout.py (tiny model, short reasoning, shared decode batch); the local search server
adds a fixed latency to every request (`SearchServer(latency_s=...)`), over real HTTP. Greedy
decoding: both arms produce identical trajectories (checked).

    .venv/bin/python benchmarks/tool_latency.py   # writes benchmarks/results/tool_latency.{json,md}
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # benchmarks/rollout.py

from rollout import (CORPUS, PLANNERS, RESULTS, SHORT_THINK, check_same_work,  # noqa: E402
                     engine_options, rollout_config, scripted_policy)

from matpo_jax import tools  # noqa: E402
from matpo_jax.agents.rollout import run_rollouts  # noqa: E402
from matpo_jax.tools.search_server import SearchServer  # noqa: E402

LATENCIES_S = (0.0, 0.05, 0.2)
REPEATS = 3
ARMS = {"tools waited for": False, "tools in the background": True}  # -> async_tools


def main() -> None:
    started = time.perf_counter()
    config = rollout_config(1024, 96)
    questions = [p.question for p in PLANNERS]
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = pathlib.Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
        with SearchServer(corpus) as server:  # the policy is fitted on the real tool outputs
            fitting_tools = tools.worker_toolbox(server.url)
            policy = scripted_policy(PLANNERS, [], lambda n, a: fitting_tools.call(n, a).text,
                                     config.report_max_chars, user_query_recap=False,
                                     think=SHORT_THINK, max_steps=3000)
        for latency in LATENCIES_S:
            with SearchServer(corpus, latency_s=latency) as server:
                toolbox = tools.worker_toolbox(server.url)
                arms = {name: dataclasses.replace(config, async_tools=flag)
                        for name, flag in ARMS.items()}

                def run(cfg):
                    return run_rollouts(policy.state, policy.graphdef, policy.chat, toolbox,
                                        questions, cfg, jax.random.key(0), engine_options(cfg))

                warm = {name: run(cfg) for name, cfg in arms.items()}
                check_same_work(*warm.values())
                runs = {name: [] for name in arms}
                for _ in range(REPEATS):
                    for name, cfg in arms.items():
                        runs[name].append(run(cfg).metrics)
            arms_summary = {name: {key: statistics.median(m[key] for m in metrics) for key in (
                "rollouts_per_s", "wall_time_s", "decode_steps", "host_calls",
                "slot_utilisation", "resumed_in_place", "prefills")}
                for name, metrics in runs.items()}
            waited, background = (arms_summary[name] for name in ARMS)
            cases.append({"latency_s": latency, "arms": arms_summary,
                          "speedup": background["rollouts_per_s"] / waited["rollouts_per_s"],
                          "tool_calls": sum(len(r.tool_calls) for r in warm[next(iter(ARMS))]
                                            .by_role("worker"))})
            print(f"latency {latency * 1000:.0f} ms: {cases[-1]['speedup']:.2f}x", flush=True)
    write({"benchmark": "rollouts with slow tools: waited for vs in the background",
           "cases": cases, "repeats": REPEATS, "statistic": "median",
           "total_s": time.perf_counter() - started,
           "machine": {"platform": platform.platform(), "jax": jax.__version__,
                       "backend": jax.default_backend(), "cpus": os.cpu_count()}})


def write(results: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tool_latency.json").write_text(json.dumps(results, indent=2) + "\n")
    waited, background = ARMS
    lines = [
        "# Rollouts with slow tools: waited for vs in the background (`async_tools`)",
        "",
        f"The batch of benchmarks/rollout.py (6 planners, 18 workers, "
        f"{results['cases'][0]['tool_calls']} worker tool calls, 12 slots, tiny model, short "
        "reasoning, shared decode batch); the local search server delays every answer by the "
        f"latency below. Median of {results['repeats']} interleaved runs on "
        f"{results['machine']['backend']} ({results['machine']['cpus']} cores); identical "
        "trajectories in both arms.",
        "",
        f"| tool latency | {waited}: rollouts/s (wall s) | {background}: rollouts/s (wall s) | "
        "speed-up | host calls waited / background |",
        "|---|---|---|---|---|",
    ]
    for case in results["cases"]:
        w, b = case["arms"][waited], case["arms"][background]
        lines.append(f"| {case['latency_s'] * 1000:.0f} ms | {w['rollouts_per_s']:.2f} "
                     f"({w['wall_time_s']:.2f}) | {b['rollouts_per_s']:.2f} "
                     f"({b['wall_time_s']:.2f}) | **{case['speedup']:.2f}x** | "
                     f"{w['host_calls']:.0f} / {b['host_calls']:.0f} |")
    lines += [
        "",
        "Waiting for the tools stalls every slot for the slowest call of each host call; in the "
        "background, only the agents whose calls are out wait, and they come back into a slot "
        "(their own, if nobody took it) when the results are in. With the local server (0 ms) "
        "the extra host calls and re-admissions cost more than the waits they save, so "
        "`rollout.async_tools` is off by default and on in the pod config, whose tools are "
        "remote.",
        "",
        "Reproduce: `.venv/bin/python benchmarks/tool_latency.py`.", ""]
    (RESULTS / "tool_latency.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
