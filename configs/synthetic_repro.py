"""Miniature reproduction of the paper's comparison: single-agent GRPO vs MATPO from the same reading
warm start, with the same SFT budget (demonstrations of each run's own way of working) and the same
RL budget and question stream, at a chosen noise level.

  python -m matpo_jax.train --config=configs/synthetic_repro.py:mode=matpo,noise=0.6,seed=1 --workdir=...
  arguments: mode=matpo|single, noise=<0..1>, seed=<int>, recap=<bool>, summary=<bool> (ablations)

Where the mechanism acts: the tools return whole pages (up to 1,400 characters), and the world's
noise is the share of irrelevant sentences on them, so noise lengthens every tool response. A
single agent carries every listing and page of every hop in its one 1,024-token context; MATPO's
planner reads only the workers' reports, each worker one hop's pages in a fresh context. Oracle
contexts (docs/repro/README.md): at noise 0.05 a two-hop single-agent episode is ~850 tokens and
fits; at 0.6 it is ~1,080 and does not (a worker's one hop: ~770).
"""
import os

from matpo_jax.config import load_config_file, parse_arg

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config(arg=None):
    a = parse_arg(arg, mode="matpo", noise=0.6, seed=0, recap=True, summary=True)
    # The demo's model (the reading warm start), world and SFT recipe (its RL recipe of Dec 4 is
    # pinned below): only the ways of working, the noise and the tool output's length differ.
    c = load_config_file(os.path.join(HERE, "synthetic_demo.py"))
    c.rollout.mode = a.mode
    c.sft.modes = a.mode  # each method's SFT demonstrates its own way of working...
    c.rollout.user_query_recap = a.recap  # ...in its own prompt format (the oracle follows both)
    c.rollout.final_summary = a.summary
    c.data.noise = a.noise
    c.train.seed = a.seed
    c.data.shuffle_seed = a.seed
    c.tools.max_response_chars = 1400  # whole pages (as the demo): the noise is in the context
    # The RL recipe docs/repro's table was measured with (Dec 4): 20 steps of 8 questions at lr
    # 1e-4. The demo has since moved to 8 steps of 32 (docs/findings.md 0p); the grid keeps its
    # own until it is rerun, so its committed table stays what this config reproduces.
    c.data.batch_size = 8
    c.rl.update(lr=1e-4, micro_batches=8, pack_rows=8)
    c.train.update(steps=20, eval_every=10, checkpoint_every=10)
    if a.mode == "single":
        # The single agent does every hop itself: as many turns per hop as a MATPO worker gets
        # (search, open, ... per hop, then the answer). With the planner's 4 it could not finish
        # a two-hop question (search, open, search, open, answer = 5 turns).
        c.rollout.max_turns_planner = c.data.max_hops * c.rollout.max_turns_worker
    c.eval.update(split="test", num_questions=0, curve_questions=96)  # all 360 test questions
    return c
