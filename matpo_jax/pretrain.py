"""Builds the embedded default's reading warm start (run/pretrain.py).

    python -m matpo_jax.pretrain --config=configs/synthetic_tiny.py \
        --workdir=runs/pretrain --out=warm_starts/synthetic_tiny

Trains model.arch on reading tasks over the configured world for pretrain.steps steps (resumes
from <workdir>/checkpoints/pretrain when rerun), prints the held-out reading accuracy, and writes
a Hugging Face directory to --out with warm_start.json (sha256 of the weights: the value of
model.hf_checkpoint_sha256 in the config that starts from it).
"""
from __future__ import annotations

import json
import sys

from absl import app, flags

from matpo_jax import config as config_lib

_RUN = config_lib.define_run_flags(default_config="configs/synthetic_tiny.py",
                                   default_workdir="runs/pretrain")
_OUT = flags.DEFINE_string("out", "warm_starts/synthetic_tiny", "Where the warm start is written.")


@config_lib.one_line_errors
def main(argv):
    del argv
    # The config may already name the warm start this command (re)builds: its directory and hash
    # are not checked (the model is built from model.arch).
    _, workdir = _RUN.checked_start(check_files=False, resume_check=False)
    cfg = _RUN.config_for_devices(check_files=False)
    from matpo_jax.run.pretrain import run_pretrain
    summary = run_pretrain(cfg, workdir, _OUT.value,
                           command=" ".join(["python -m matpo_jax.pretrain", *sys.argv[1:]]))
    print(json.dumps({k: summary[k] for k in ("accuracy", "sha256", "bytes", "wall_s")}, indent=1))
    print(f"warm start: {_OUT.value} (model.hf_checkpoint_sha256={summary['sha256']})")


if __name__ == "__main__":
    sys.exit(app.run(main, flags_parser=config_lib.flags_parser))
