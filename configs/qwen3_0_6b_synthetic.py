"""MATPO from a real Qwen3-0.6B in the synthetic research world, on ONE accelerator chip (a Colab
TPU v5e-1 runtime, 16 GiB, or one GPU): the notebook's real-checkpoint section.

  huggingface-cli download Qwen/Qwen3-0.6B --local-dir Qwen3-0.6B     # weights, tokenizer
  python -m matpo_jax.train --config=configs/qwen3_0_6b_synthetic.py:model.hf_checkpoint=Qwen3-0.6B \
      --workdir=runs/qwen3_0_6b_synthetic
  python -m matpo_jax.plan --config=configs/qwen3_0_6b_synthetic.py --topology=v5e-1

The argument after the colon is overrides, as synthetic_tiny's ("model.hf_checkpoint=DIR,
train.steps=20"). synthetic_tiny's world (1,000 entities, 1-2 hops, plain facts, low noise) and
tools; the model, its tokenizer and chat template are the checkpoint's (the world's own tokenizer
is not trained). Per-chip memory on v5e-1: benchmarks/results/plan_qwen3_0_6b_synthetic_v5e-1.json.
"""
import os

from matpo_jax.config import apply_overrides, load_config_file

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config(arg=None):
    c = load_config_file(os.path.join(HERE, "synthetic_tiny.py"))
    c.model.hf_checkpoint = "Qwen3-0.6B"  # a local directory; its config.json wins over arch
    # bf16 compute, f32 master weights and Adam moments: RL updates of ~1e-6 relative to the
    # weights vanish when rounded to bf16's 8-bit mantissa.
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    # Qwen3-0.6B as published (what the plan compiles; a run reads DIR/config.json).
    c.model.arch.update(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                        head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                        max_position_embeddings=40960)
    c.mesh.update(data=1, fsdp=-1, tensor=1)
    # Qwen3's tokenizer spends more tokens on the world's pseudo-word names and its system turn
    # holds the tools' JSON schemas: twice synthetic_tiny's context. 128 tokens a turn: after SFT
    # the model acts without a <think> block (the demonstrations have none).
    c.rollout.update(group_size=8, max_context=2048, max_new_tokens_per_turn=128,
                     max_turns_planner=4, max_turns_worker=4, decode_slots=32,
                     report_max_chars=300, final_summary_max_tokens=96)
    # Thinking mode (Qwen3's default prompt, no empty think block): the SFT demonstrations carry
    # no think text, so SFT itself teaches the model to act without reasoning; the prompts stay
    # the ones the released checkpoint knows. chat.enable_thinking=false is the other choice.
    c.chat.enable_thinking = True
    # Short SFT of the protocol only (the subagent tool, the report, \boxed{} answers, no think
    # text): a pretrained model already reads, so no copy rehearsal and plain cross-entropy.
    c.sft.update(steps=100, lr=1e-5, batch_size=4, num_demos=400, copy_every=0, copy_weight=1.0,
                 wasted_search=0.0, wrong_open=0.0)
    # 4 questions x G = 8 per step; the lr of GRPO on small Qwen3s at this batch size.
    c.rl.update(lr=2e-6, warmup_steps=0, pack_rows=4, pack_len=2048, micro_batches=1)
    c.train.update(steps=40, eval_every=10, checkpoint_every=10, log_every=1, remat="full")
    # The curve on the first 64 validation questions (steps 0 and 40 from the full evaluations of
    # 128), 3 evaluations in between.
    c.eval.update(num_questions=128, curve_questions=64)
    return apply_overrides(c, arg)
