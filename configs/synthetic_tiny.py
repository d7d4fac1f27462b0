"""The demo (`make demo`): a tiny Qwen3 learns to plan and delegate in the synthetic world, on a CPU.

SFT warm start on oracle demonstrations of both roles, then MATPO RL, evaluation before and after.

  python -m matpo_jax.train --config=configs/synthetic_tiny.py --workdir=runs/tiny
"""
from matpo_jax.config import apply_overrides, base_config


def get_config(arg=None):
    c = base_config()
    # vocab 2048: most entity names and every relation word are 1-2 tokens (1024 split them into
    # 3-5). rope_theta 1e4: a 1k context does not need Qwen3's 1e6, whose slow rotations give a
    # tiny model little relative-position signal for previous-token / copy heads.
    c.model.arch.update(vocab_size=2048, hidden_size=128, intermediate_size=384,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, max_position_embeddings=2048, rope_theta=1e4)
    # 1000 entities: names too many to memorise, so SFT must learn to COPY them from the context
    # (with 200 the model memorised train names and hallucinated them at test time). Short pages.
    c.data.update(num_entities=1000, num_questions=2400, max_hops=2, noise=0.05, batch_size=8)
    c.rollout.update(group_size=4, max_context=1024, max_new_tokens_per_turn=64,
                     max_turns_planner=4, max_turns_worker=4, decode_slots=32,
                     report_max_chars=200, final_summary_max_tokens=64)
    c.tools.update(num_results=2, max_response_chars=320)
    # Many small high-lr steps: copying (induction) needs optimizer steps more than rows per step.
    # No oracle detours: the shortest correct path is the easiest behaviour to clone.
    # copy_weight: trainable tokens that repeat a span of the context (entity names, page ids,
    # answers: sft_data.copy_token_mask) weigh 5x: a small teacher-forced gain at the same budget
    # (worker fact-turn tokens 0.53 -> 0.57, answer turns 0.79 -> 0.80; 20x is no better), greedy
    # accuracy still 0 at this budget. Copy pre-training (sft.copy_steps) did not pay for the SFT
    # steps it takes at this budget (200 steps do not form an induction head here), so it is off.
    c.sft.update(steps=1000, lr=1e-2, batch_size=2, num_demos=1600, wasted_search=0.0,
                 wrong_open=0.0, copy_weight=5.0, copy_steps=0)
    c.rl.update(lr=1e-4, pack_rows=8, pack_len=1024, warmup_steps=0)
    c.train.update(steps=20, eval_every=0, checkpoint_every=10, log_every=1)
    c.eval.update(num_questions=96)
    return apply_overrides(c, arg)
