"""Builds the embedded default's reading warm start (run/pretrain.py).

    python -m matpo_jax.pretrain --config=configs/synthetic_tiny.py \
        --workdir=runs/pretrain --out=warm_starts/synthetic_tiny

Trains model.arch on reading tasks over the configured world for pretrain.steps steps (resumes
from <workdir>/checkpoints/pretrain when rerun), prints the held-out reading accuracy, and writes
a Hugging Face directory to --out with warm_start.json (sha256 of the weights: the value of
model.hf_checkpoint_sha256 in the config that starts from it). --out must be new, empty or an
earlier warm start; without --out the default is used only while it holds none, so the committed
warm start is replaced only by a command that names it.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags

from matpo_jax import config as config_lib

_RUN = config_lib.define_run_flags(default_config="configs/synthetic_tiny.py",
                                   default_workdir="runs/pretrain")
DEFAULT_OUT = "warm_starts/synthetic_tiny"
_OUT = flags.DEFINE_string(
    "out", None, f"Where the warm start is written (default: {DEFAULT_OUT} while it holds no warm "
    "start; a committed one is replaced only when --out names it).")


def out_dir(out: str | None) -> str:
    """--out, or the default directory when it holds nothing yet: a committed warm start there is
    what configs pin by sha256, so only an --out that names it replaces it."""
    if out:
        return out
    if os.path.isdir(DEFAULT_OUT) and os.listdir(DEFAULT_OUT):
        raise config_lib.ConfigError(
            f"--out not given, and its default {DEFAULT_OUT} holds a warm start already (the "
            "committed one configs pin by model.hf_checkpoint_sha256): pass --out=DIR for a new "
            f"warm start, or --out={DEFAULT_OUT} to replace that one on purpose")
    return DEFAULT_OUT


@config_lib.one_line_errors
def main(argv):
    del argv
    # The config may already name the warm start this command (re)builds: its directory and hash
    # are not checked (the model is built from model.arch).
    _, workdir = _RUN.checked_start(check_files=False, resume_check=False)
    out = out_dir(_OUT.value)
    cfg = _RUN.config_for_devices(check_files=False)
    from matpo_jax.run.pretrain import run_pretrain
    summary = run_pretrain(cfg, workdir, out,
                           command=" ".join(["python -m matpo_jax.pretrain", *sys.argv[1:]]))
    print(json.dumps({k: summary[k] for k in ("accuracy", "sha256", "bytes", "wall_s")}, indent=1))
    print(f"warm start: {out} (model.hf_checkpoint_sha256={summary['sha256']})")


if __name__ == "__main__":
    sys.exit(app.run(main, flags_parser=config_lib.flags_parser))
