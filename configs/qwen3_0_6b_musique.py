"""The paper's MATPO run scaled to Qwen3-0.6B (one accelerator, a small slice, or a Colab runtime).

  python -m matpo_jax.train --config=configs/qwen3_0_6b_musique.py:checkpoint=DIR \
      --config.data.manual_dir=M --workdir=gs://...
  python -m matpo_jax.train --config=configs/qwen3_0_6b_musique.py:checkpoint=DIR,offline \
      --config.data.manual_dir=M --workdir=runs/0_6b_offline
  python -m matpo_jax.plan --config=configs/qwen3_0_6b_musique.py --topology=v5e-8

Every setting of configs/qwen3_4b_musique.py (same arguments: mode=matpo|single, checkpoint=DIR,
offline: the local search service over MuSiQue's paragraphs, exact-match reward)
except the model's dimensions and the decode slots.
"""
from pathlib import Path

from matpo_jax.config import load_config_file


def get_config(arg=None):
    # The default checkpoint first: a checkpoint=... in `arg` comes later and wins.
    c = load_config_file(Path(__file__).with_name("qwen3_4b_musique.py"),
                         ",".join(filter(None, ["checkpoint=/mnt/disks/persist/Qwen3-0.6B", arg])))
    c.model.arch.update(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                        head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                        max_position_embeddings=40960)
    c.mesh.update(data=1, fsdp=-1, tensor=1)  # 16 heads / 8 kv heads: plain FSDP on a v5e-8
    # What fits a v5e-8's 16 GiB per chip (benchmarks/results/plan.md): the 16 x 40,960-token
    # train batch in 2 micro-batches, and 16 decode slots of 40,960 tokens.
    c.rl.micro_batches = 2
    c.rollout.decode_slots = 16
    return c
