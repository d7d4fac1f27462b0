"""The paper's MATPO run scaled to Qwen3-14B (a v5p-128 slice).

  python -m matpo_jax.train --config=configs/qwen3_14b_musique.py --workdir=gs://...
  python -m matpo_jax.plan --config=configs/qwen3_14b_musique.py --topology=v5p-128

Every setting of configs/qwen3_4b_musique.py (same arguments: mode=matpo|single, checkpoint=DIR,
offline: the local search service over MuSiQue's paragraphs, exact-match reward)
except the model's dimensions and the mesh.
"""
from pathlib import Path

from matpo_jax.config import load_config_file


def get_config(arg=None):
    # The default checkpoint first: a checkpoint=... in `arg` comes later and wins.
    c = load_config_file(Path(__file__).with_name("qwen3_4b_musique.py"),
                         ",".join(filter(None, ["checkpoint=/mnt/disks/persist/Qwen3-14B", arg])))
    c.model.arch.update(vocab_size=151936, hidden_size=5120, intermediate_size=17408,
                        num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                        head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
                        max_position_embeddings=40960)
    c.mesh.update(data=1, fsdp=-1, tensor=8)  # 64 chips: fsdp 8 x tensor 8 (40 heads, 8 kv heads)
    return c
