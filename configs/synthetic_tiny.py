"""The demo (`make demo`): a tiny Qwen3 learns to plan and delegate in the synthetic world, on a CPU.

SFT warm start on oracle demonstrations of both roles, then MATPO RL, evaluation before and after.

  python -m matpo_jax.train --config=configs/synthetic_tiny.py --workdir=runs/tiny
"""
from matpo_jax.config import apply_overrides, base_config


def get_config(arg=None):
    c = base_config()
    c.model.arch.update(vocab_size=1024, hidden_size=128, intermediate_size=384,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, max_position_embeddings=2048)
    c.data.update(num_entities=200, num_questions=2400, max_hops=3, noise=0.3, batch_size=8)
    c.rollout.update(group_size=4, max_context=1024, max_new_tokens_per_turn=64,
                     max_turns_planner=4, max_turns_worker=4, decode_slots=32,
                     report_max_chars=200, final_summary_max_tokens=64)
    c.tools.update(num_results=3, max_response_chars=600)
    c.sft.update(steps=150, lr=3e-3, batch_size=8, num_demos=600)
    c.rl.update(lr=1e-4, pack_rows=8, pack_len=1024, warmup_steps=0)
    c.train.update(steps=20, eval_every=0, checkpoint_every=10, log_every=1)
    c.eval.update(num_questions=96)
    return apply_overrides(c, arg)
