"""The paper's comparison on the real model: single-agent GRPO vs MATPO from SmolLM2-135M-Instruct
(configs/smollm2_synthetic.py), with the same SFT and RL budgets and question stream, at a chosen
noise level of the synthetic world (configs/synthetic_repro.py is the same comparison on the
984k-parameter model).

  python -m matpo_jax.train --config=configs/smollm2_repro.py:mode=single,noise=0.6,seed=0 --workdir=...
  arguments: mode=matpo|single, noise=<0..1>, seed=<int>

Where the mechanism acts: the tools return whole pages (up to 1,400 characters) and the world's
noise is the share of irrelevant sentences on them. A single agent carries every hop's listing
and page in its one context; MATPO's planner reads only the workers' reports, each worker one
hop's pages in a fresh context. Both get the same context, sized from the oracle's own episodes
in SmolLM2's tokens (benchmarks/oracle_contexts.py, benchmarks/results/oracle_contexts_smollm2_repro.md).
"""
import os

from matpo_jax.config import load_config_file, parse_arg

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config(arg=None):
    a = parse_arg(arg, mode="matpo", noise=0.6, seed=0)
    c = load_config_file(os.path.join(HERE, "smollm2_synthetic.py"))
    c.rollout.mode = a.mode
    c.sft.modes = a.mode  # each method's SFT demonstrates its own way of working
    c.data.noise = a.noise
    c.train.seed = a.seed
    c.data.shuffle_seed = a.seed
    # The oracle's episodes at noise 0.6 (mean / 90th percentile / max tokens of 200
    # demonstrations): a MATPO worker 972 / 1,039 / 1,378, a single agent's 1 hop 902 / 961 /
    # 1,312 and 2 hops 1,459 / 1,565 / 1,733. 1,408 holds every worker and one-hop single agent,
    # few two-hop ones: the miniature's proportions (its 1,024 held a worker's 774, not a two-hop
    # single agent's 1,076).
    c.rollout.max_context = 1408
    if a.mode == "single":
        # The single agent does every hop itself: as many turns per hop as a MATPO worker gets.
        c.rollout.max_turns_planner = c.data.max_hops * c.rollout.max_turns_worker
        c.sft.worker_fraction = 1.0  # no workers: every demonstration is kept whole
    return c
