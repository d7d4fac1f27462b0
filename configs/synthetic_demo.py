"""The demo (`make demo`): MATPO in the synthetic world from a warm start that can already read.

synthetic_tiny's world, tools and rollout budgets, but the model is the committed reading warm
start (warm_starts/synthetic_tiny: synthetic_tiny's architecture pretrained on random-fact reading
tasks over whole pages, `python -m matpo_jax.pretrain` with this config's pretrain section; its
tokenizer travels with it), loaded only if its weights have the sha256 below. SFT then teaches the
roles' protocol (rehearsing reading on its copy steps), and RL starts from a policy that can read.

  python -m matpo_jax.demo --config=configs/synthetic_demo.py --workdir=runs/demo
  rebuild the warm start (then set WARM_START_SHA256 to the sha256 it prints; another kind of
  machine computes other bytes, warm_start.json says where these were made):
  python -m matpo_jax.pretrain --config=configs/synthetic_demo.py --out=warm_starts/synthetic_tiny
"""
import os

from matpo_jax.config import apply_overrides, load_config_file

HERE = os.path.dirname(os.path.abspath(__file__))
WARM_START = os.path.join(os.path.dirname(HERE), "warm_starts", "synthetic_tiny")
WARM_START_SHA256 = "0184f93121685667d9a81a2518bc7f458a818308923990a4468fa66aabea49a2"


def get_config(arg=None):
    c = load_config_file(os.path.join(HERE, "synthetic_tiny.py"))
    c.model.hf_checkpoint = WARM_START
    c.model.hf_checkpoint_sha256 = WARM_START_SHA256
    # The warm start's recipe: 16 rows a step read better than 4 for the same wall time
    # (docs/embedded_default.md: 76.8% vs 57.6% of held-out whole-page tasks after ~6 minutes
    # each on one GPU).
    c.pretrain.update(steps=1400, batch_size=16, lr=3e-3)
    # The protocol, not reading: half synthetic_tiny's SFT steps, reading tasks rehearsed on
    # every 4th step instead of copy spans (SFT alone erodes what the warm start can do). 500
    # steps leave more to RL but end lower (49.6% vs 68.5% over 3 seeds, docs/findings.md 0k).
    c.sft.update(steps=1000, lr=2e-3, rehearsal="reading", num_demos=1000)
    # RL: format credit only with a right answer (an all-wrong group then has no advantage; with
    # MATPO's rule, format differences among wrong samples dropped a seed's second delegation,
    # docs/findings.md section 0). 32 questions a step at lr 3e-4 for 8 steps: from one SFT
    # start, 8 questions a step ended at 65% whatever the lr (1e-4 to 3e-4) or the step count
    # (20, 30), 16 a step at 68.3%, 32 at 69.2% (docs/findings.md 0p).
    c.reward.update(format_credit="when_correct")
    c.data.update(batch_size=32)
    # 16 micro-batches: the packed batch grows with the rollouts (256-512 rows of 1,024 tokens
    # at 32 questions), and its attention's memory with the rows of a micro-batch (one of 64-128
    # rows held ~9 GB; benchmarks/micro_batch_memory.py; three demos side by side held ~5 GB in
    # all). Same update up to float rounding. pack_rows: at least a row per micro-batch.
    # A KL term to the RL start (low_var_kl, 0.05): without it a seed's planner can learn to
    # delegate a second hop on one-hop questions (docs/findings.md 0q, 0r); with it no seed
    # drifted on either CPU (0s, 0t). Its reference pass and the update hold each question's
    # prompt once per packed row (rl.share_prompts, the default).
    c.rl.update(lr=3e-4, micro_batches=16, pack_rows=16, kl_coef=0.05)
    # Whole tool responses: synthetic_tiny's 320-character cap cut every two-result search
    # listing (~510 characters) before its second result, and a quarter of the pages opened.
    # With whole responses (the reproduction's setting, docs/repro) MATPO RL gained +13.6 and
    # +13.8, +12.5 points on test questions from one SFT start (30.6%), against +2 to +6 with the cap.
    c.tools.update(max_response_chars=1400)
    c.train.update(steps=8, eval_every=4, checkpoint_every=4)
    return apply_overrides(c, arg)
