"""Training entry point: SFT warm start, then MATPO (or single-agent GRPO) RL, with evaluation.

    python -m matpo_jax.train --config=configs/synthetic_tiny.py --workdir=runs/tiny
    python -m matpo_jax.train --config=configs/synthetic_repro.py:mode=single,noise=0.6 --workdir=...

Re-running the same command resumes from the newest checkpoint of whichever phase was running:
parameters, optimizer state, step, RNG and the data-iterator position all come back, so a run
killed at any point ends with the same parameters as one that never stopped.
"""
from __future__ import annotations

import json

from absl import app, flags, logging

from matpo_jax import config as config_lib

_CONFIG, _WORKDIR = config_lib.define_flags()
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() (TPU pods).")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Keep third-party INFO logs (Orbax, TFDS...).")


def main(argv):
    del argv
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required")
    from matpo_jax.report import logs
    logs.configure(verbose=_VERBOSE.value)
    from matpo_jax import parallel
    if _MULTIHOST.value:
        parallel.maybe_initialize_distributed(force=True)
    import jax

    cfg = config_lib.config_from_flags(_CONFIG, jax.device_count())
    from matpo_jax.run.experiment import run_experiment
    summary = run_experiment(cfg, _WORKDIR.value)
    logging.info("final evaluation: %s", json.dumps(summary.get("final_eval", {}), indent=1))


if __name__ == "__main__":
    app.run(main, flags_parser=config_lib.flags_parser)
