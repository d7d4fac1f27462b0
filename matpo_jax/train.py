"""Training entry point: SFT warm start, then MATPO (or single-agent GRPO) RL, with evaluation.

    python -m matpo_jax.train --config=configs/synthetic_tiny.py --workdir=runs/tiny
    python -m matpo_jax.train --config=configs/synthetic_repro.py:mode=single,noise=0.6 --workdir=...
    python -m matpo_jax.train --config=configs/base.py --config.rl.lr=3e-4 --workdir=...

Re-running the same command resumes from the newest checkpoint of whichever phase was running:
parameters, optimizer state, step, RNG and the data-iterator position all come back, so a run
killed at any point ends with the same parameters as one that never stopped. A rerun with another
config is refused (one line per changed field); --allow_config_change=train.steps,... accepts
changes of the total steps and cadences. User errors are one line and exit 2 (--verbose: traceback).

Several processes (one per host of a TPU pod, or several on one machine) run the same command:
    python -m matpo_jax.train ... --coordinator=HOST:PORT --num_processes=N --process_id=I
(on TPU VMs --multihost auto-detects all three). Each process draws its share of every batch of
questions and runs its own rollouts on its own devices; the update is the one-process update.
"""
from __future__ import annotations

import json

from absl import app, flags, logging

from matpo_jax import config as config_lib

_RUN = config_lib.define_run_flags()
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() (TPU pods).")
_CHECK_FIT = flags.DEFINE_bool(
    "check_fit", True, "Before any work, refuse a config whose parameters, optimizer state and "
    "KV cache cannot fit a chip's memory (TPU only, unless --hbm_per_chip_gib is given).")
_HBM_PER_CHIP = flags.DEFINE_float(
    "hbm_per_chip_gib", None, "Per-chip memory budget for --check_fit (default: the TPU's).")
_COORDINATOR = flags.DEFINE_string("coordinator", None,
                                   "HOST:PORT of process 0's coordination service (a multi-process "
                                   "run without cluster auto-detection).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes of the run (--coordinator).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (--coordinator).")
_HEARTBEAT = flags.DEFINE_integer("heartbeat_timeout_s", None,
                                  "Seconds without a heartbeat after which a process is declared "
                                  "dead and the others fail (jax's default: 100).")
_INIT_TIMEOUT = flags.DEFINE_float(
    "initialization_timeout_s", 300.0, "Seconds to wait for every process to join "
    "(--coordinator / --multihost); then one line names the coordinator and the processes not "
    "seen, and the process exits (3).")


@config_lib.one_line_errors
def main(argv):
    del argv
    # Everything that can be checked without jax first: a bad command line fails in a second.
    budget = _HBM_PER_CHIP.value
    if budget is not None and not budget > 0:  # 0 once read as "not given": no check at all
        raise config_lib.ConfigError(f"--hbm_per_chip_gib={budget:g}: must be > 0 (GiB of memory "
                                     "per chip); leave it out for the TPU's own")
    _, workdir = _RUN.checked_start()
    from matpo_jax import parallel
    if _MULTIHOST.value or _COORDINATOR.value:
        try:
            parallel.maybe_initialize_distributed(
                force=True, coordinator=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
                process_id=_PROCESS_ID.value, heartbeat_timeout_s=_HEARTBEAT.value,
                initialization_timeout_s=_INIT_TIMEOUT.value)
        except ValueError as error:  # a flag combination that cannot start
            raise config_lib.ConfigError(str(error)) from None
    cfg = _RUN.config_for_devices()
    if _CHECK_FIT.value:  # an impossible config stops here, not in an OOM after SFT
        from matpo_jax.planning.fit import summary as fit_summary
        from matpo_jax.run.fit_check import check_config_fits
        fits = check_config_fits(cfg, int(budget * 2**30) if budget is not None else None)
        if fits is not None:
            logging.info("memory check: %s", fit_summary(fits))
    from matpo_jax.run.experiment import run_experiment
    summary = run_experiment(cfg, workdir, allow_config_change=_RUN.allow_config_change.value)
    logging.info("final evaluation: %s", json.dumps(summary.get("final_eval", {}), indent=1))


if __name__ == "__main__":
    app.run(main, flags_parser=config_lib.flags_parser)
