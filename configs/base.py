"""The default experiment: a small MATPO run on the synthetic multi-hop world, sized for a CPU.

Every field is declared once, with its default, type, allowed values and a line of help, in
matpo_jax/config/sections.py; `base_config()` is the ConfigDict view of those declarations, and
other config files start from it.

  python -m matpo_jax.train --config=configs/base.py --workdir=runs/base
  python -m matpo_jax.train --config=configs/base.py:rollout.mode=single,train.seed=1 --workdir=...
  python -m matpo_jax.train --config=configs/base.py --config.rl.lr=3e-4 --workdir=...

The optional argument is a comma-separated list of dotted overrides (tuples: items joined by "+").
"""
from matpo_jax.config import apply_overrides, base_config


def get_config(arg=None):
    return apply_overrides(base_config(), arg)
