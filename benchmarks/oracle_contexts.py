"""How long the oracle's own episodes are in a config's tokens: the contexts a policy that works
as demonstrated needs, per way of working, role and hop count (mean / 90th percentile / max).

Builds the config's world and demonstrations exactly as SFT does (run/sft.py, with the local
search service answering the oracle's tool calls), renders each conversation with the run's chat
format, and counts tokens, with no context limit (SFT drops demonstrations that do not fit
`rollout.max_context`; here none is dropped, so the table says which would be). Sets the context
of a comparison: a single agent carries every hop's pages in one context, a MATPO worker one
hop's.

    python benchmarks/oracle_contexts.py --config=configs/smollm2_repro.py --modes=matpo,single \
        --noise=0.05,0.6                # writes benchmarks/results/oracle_contexts_<config>.md
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
import types

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def episode_lengths(config: str, mode: str, noise: float, demos: int, data_dir: str) -> dict:
    """{(role, hops): [tokens of each conversation]} of `demos` oracle demonstrations."""
    from matpo_jax.config import apply_overrides, load_config_file, to_typed
    from matpo_jax.data.task_assets import prepare_task
    from matpo_jax.run import runtime, sft
    from matpo_jax.tools.search_server import SearchServer

    raw = load_config_file(config)
    raw = apply_overrides(raw, f"rollout.mode={mode},sft.modes={mode},data.noise={noise},"
                               f"sft.num_demos={demos},sft.worker_fraction=1.0")
    cfg = to_typed(raw)
    assets = prepare_task(cfg, os.path.join(data_dir, f"noise{noise}"))
    out = collections.defaultdict(list)
    with SearchServer(assets.corpus_path) as server:
        rt = types.SimpleNamespace(cfg=cfg, assets=assets,
                                   toolbox=runtime.make_toolbox(cfg.tools, server.url),
                                   chat=runtime.run_chat(cfg, assets.chat))
        questions, demos = sft.sft_demonstrations(rt)
        if len(demos) != len(questions):
            raise ValueError(f"one way of working at a time, got sft.modes={cfg.sft.modes!r}")
        for question, demo in zip(questions, demos):
            for d in [demo, *demo.workers]:
                ids, _ = rt.chat.render(d.messages)
                out[(d.role, 1 if d.role == "worker" else question.num_hops)].append(len(ids))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "smollm2_repro.py"))
    parser.add_argument("--modes", default="matpo,single")
    parser.add_argument("--noise", default="0.05,0.6")
    parser.add_argument("--demos", type=int, default=200)
    parser.add_argument("--out", default=None, help="markdown path (default: "
                        "benchmarks/results/oracle_contexts_<config>.md), or - to print only")
    args = parser.parse_args()
    lines = [f"# Oracle episode contexts, {os.path.basename(args.config)} "
             f"({time.strftime('%Y-%m-%d')})", "",
             f"`python benchmarks/oracle_contexts.py --config={os.path.relpath(args.config, REPO)}"
             f" --modes={args.modes} --noise={args.noise} --demos={args.demos}`; tokens of each "
             "conversation the oracle writes for the SFT demonstrations (mean / 90th percentile "
             "/ max, count)", "",
             "| noise | way of working | role | hops | tokens |", "|---|---|---|---:|---|"]
    with tempfile.TemporaryDirectory() as data_dir:
        for noise in (float(n) for n in args.noise.split(",")):
            for mode in args.modes.split(","):
                lengths = episode_lengths(args.config, mode, noise, args.demos, data_dir)
                for (role, hops), values in sorted(lengths.items(), key=str):
                    v = np.asarray(values)
                    lines.append(f"| {noise} | {mode} | {role} | {hops} | {v.mean():.0f} / "
                                 f"{np.percentile(v, 90):.0f} / {v.max()} ({len(v)}) |")
                print("\n".join(lines[-len(lengths):]), flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or os.path.join(REPO, "benchmarks", "results", "oracle_contexts_" + os.path.basename(
        args.config).removesuffix(".py") + ".md")
    if out != "-":
        with open(out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
