"""The demo (`make demo`): a tiny Qwen3 learns to plan and delegate in the synthetic world, on a CPU.

SFT warm start on oracle demonstrations of both roles, then MATPO RL, evaluation before and after.

  python -m matpo_jax.train --config=configs/synthetic_tiny.py --workdir=runs/tiny
"""
from matpo_jax.config import apply_overrides, base_config


def get_config(arg=None):
    c = base_config()
    # vocab 3072: with whole-number pre-tokens, nearly every entity-name word and every year or
    # population is ONE token, so copying it from a page is one step for the model (at 2048 names
    # were 2-4 pieces and greedy accuracy stayed 0). rope_theta 1e4: a 1k context does not need
    # Qwen3's 1e6, whose slow rotations give a tiny model little relative-position signal.
    c.model.arch.update(vocab_size=3072, hidden_size=128, intermediate_size=384,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, max_position_embeddings=2048, rope_theta=1e4)
    # 1000 entities: names too many to memorise, so SFT must learn to COPY them from the context
    # (with 200 the model memorised train names and hallucinated them at test time). Short pages.
    # fact_style plain: "X founder Y." lines: the value follows the relation word, which is unique
    # on the page, so reading a fact is one induction step.
    # SFT and RL questions share the train entities (data.sft_fraction=0; giving SFT its own 35%
    # of the entities left it too few names to learn copying from: validation 1% after SFT
    # instead of 7%), but RL draws only the train questions SFT did not demonstrate
    # (rl_skips_demonstrated): over 3 seeds every run then gained on validation (+1.4 to +2.2).
    c.data.update(num_entities=1000, num_questions=2400, max_hops=2, noise=0.05, batch_size=4,
                  fact_style="plain", rl_skips_demonstrated=True)
    c.rollout.update(group_size=8, max_context=1024, max_new_tokens_per_turn=64,
                     max_turns_planner=4, max_turns_worker=4, decode_slots=32,
                     report_max_chars=200, final_summary_max_tokens=64)
    c.tools.update(num_results=2, max_response_chars=320)
    # A 1M-parameter model pays per extended position, not per pass over its weights: each host
    # call's writes extended one slot at a time, each at its own width, sample the same tokens as
    # 4 slots together and cut a demo step's rollouts 37 -> 26 s (docs/findings.md 0s).
    c.rollout.update(injection_lanes=1)
    # rollout.async_tools stays off (the default): on, the order in which tool answers arrive
    # decides where agents resume, and two runs of one seed would differ with the machine's load.
    # SFT that teaches copying (measured by teacher-forced copy-token accuracy on validation
    # demonstrations, see docs/embedded_default.md): lr 3e-3 (1e-2 never forms copy heads); every
    # 4th step a copy-rehearsal batch (copy_every: "span, separator, same span" rows from the
    # corpus) keeps the induction circuit that SFT alone erodes; copy tokens weigh 5x.
    # No oracle detours: the shortest correct path is the easiest behaviour to clone.
    c.sft.update(steps=2000, lr=3e-3, batch_size=2, num_demos=1600, wasted_search=0.0,
                 wrong_open=0.0, copy_weight=5.0, copy_every=4, copy_span=24)
    # G = 8 samples of 4 questions: at a low starting accuracy more groups hold a success.
    # lr 1e-4: 3e-4 moved runs both ways (seed 1 lost 0.6 points, seed 2 gained 0.5).
    c.rl.update(lr=1e-4, pack_rows=8, pack_len=1024, warmup_steps=0)
    # The validation curve: steps 0 and 30 come from the full evaluations, steps 10 and 20 cost
    # 2 x 96 greedy rollouts (about half of one full evaluation, a fifth of RL's 960 rollouts).
    c.train.update(steps=30, eval_every=10, checkpoint_every=10, log_every=1)
    # Every validation question (360): on 96 one question is ~1 point, as much as RL moves (the
    # curve's 96 show the trend; the table reads the full evaluations).
    c.eval.update(num_questions=0, curve_questions=96)
    return apply_overrides(c, arg)
