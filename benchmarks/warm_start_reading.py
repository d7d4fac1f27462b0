"""Reading accuracy of a warm-start directory, measured on this machine.

A warm start built elsewhere (another CPU, a GPU) is measured here on the same held-out reading
tasks that `python -m matpo_jax.pretrain` scores at the end of a rebuild (run/pretrain.py:
EVAL_STREAM, teacher-forced argmax = greedy), at the page cap of the config given.

    python benchmarks/warm_start_reading.py --config=configs/synthetic_demo.py \
        --warm_start=warm_starts/synthetic_tiny [--data_dir=/tmp/tfds] [--out=result.json]
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from matpo_jax.config import load_config_file, to_typed  # noqa: E402
from matpo_jax.config.validation import file_sha256  # noqa: E402
from matpo_jax.data import synthetic_world  # noqa: E402
from matpo_jax.data.world_assets import prepare_world, world_config  # noqa: E402
from matpo_jax.model import load_pretrained  # noqa: E402
from matpo_jax.run import pretrain  # noqa: E402

_CONFIG = flags.DEFINE_string("config", "configs/synthetic_demo.py", "Config file (world, page cap).")
_WARM = flags.DEFINE_string("warm_start", "warm_starts/synthetic_tiny", "Warm-start directory.")
_DATA = flags.DEFINE_string("data_dir", None, "TFDS/tokenizer directory (default: a temp dir).")
_OUT = flags.DEFINE_string("out", None, "Also write the result here as JSON.")


def main(argv):
    del argv
    cfg = pretrain.from_scratch(to_typed(load_config_file(_CONFIG.value), check_files=False))
    data_dir = _DATA.value or tempfile.mkdtemp(prefix="warm_start_reading_")
    chat = prepare_world(cfg, data_dir).chat
    world = synthetic_world.build_world(**world_config(cfg).world_kwargs())
    model = load_pretrained(_WARM.value, dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype)
    started = time.time()
    accuracy = pretrain.reading_accuracy(
        model, chat, pretrain.reading_writer(cfg, world, pretrain.EVAL_STREAM),
        pretrain.eval_count(cfg))
    result = {"warm_start": _WARM.value,
              "sha256": file_sha256(os.path.join(_WARM.value, "model.safetensors")),
              "config": _CONFIG.value, "max_response_chars": cfg.tools.max_response_chars,
              "tasks": pretrain.eval_count(cfg), "accuracy": accuracy,
              "machine": pretrain.machine_description(), "wall_s": round(time.time() - started, 1)}
    print(json.dumps(result, indent=1))
    if _OUT.value:
        with open(_OUT.value, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    app.run(main)
