"""The default experiment: a small MATPO run on the synthetic multi-hop world, sized for a CPU.

Every field and its default is declared, with a comment, in `matpo_jax.config.base_config()` (the
schema that `validate_config` checks every experiment against); other config files start from it.

  python -m matpo_jax.train --config=configs/base.py --workdir=runs/base
  python -m matpo_jax.train --config=configs/base.py:rollout.mode=single,train.seed=1 --workdir=...
  python -m matpo_jax.train --config=configs/base.py --config.rl.lr=3e-4 --workdir=...

The optional argument is a comma-separated list of dotted overrides (tuples: items joined by "+").
"""
from matpo_jax.config import apply_overrides, base_config


def get_config(arg=None):
    return apply_overrides(base_config(), arg)
