"""A run refuses, as it starts and before config.json records it, a rollout.max_context shorter
than its first prompt and batches this host cannot hold; a run so refused reruns with the fix."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from matpo_jax.config import ConfigError, check_resume, load_config_file, to_typed

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "synthetic_tiny.py")
SMALL_WORLD = ("data.num_entities=60,data.num_questions=120,model.arch.vocab_size=600,"
               "sft.num_demos=40,sft.steps=2,train.steps=1")


def test_a_context_shorter_than_the_prompt_is_refused_before_config_json(tmp_path):
    workdir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "matpo_jax.train", f"--config={TINY}:{SMALL_WORLD}",
         "--config.rollout.max_context=150", f"--workdir={workdir}"],
        cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO)),
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]  # after the world's preparation logs
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    match = re.fullmatch(r"FATAL config error: rollout\.max_context = 150: the longest first "
                         r"prompt needs (\d+) tokens \((.+)\) and a turn takes "
                         r"rollout\.max_new_tokens_per_turn = 64: raise rollout\.max_context to "
                         r"at least (\d+)", last)
    assert match, last
    prompt, needed = int(match.group(1)), int(match.group(3))
    assert needed == prompt + 64 > 150
    # No record: the fixed config is a fresh start, not a changed resume.
    assert not (workdir / "config.json").exists()
    fixed = to_typed(load_config_file(TINY, f"{SMALL_WORLD},rollout.max_context={needed}"),
                     check_files=False)
    check_resume(fixed, str(workdir))

    # The boundary is the engine's: the world the refused run prepared, checked in-process.
    from matpo_jax.data.task_assets import prepare_task
    from matpo_jax.run.experiment import world_data_dir
    from matpo_jax.run.startup_checks import check_prompts_fit
    assets = prepare_task(fixed, world_data_dir(fixed.data, str(workdir)))
    assert check_prompts_fit(fixed, assets) == prompt
    short = to_typed(load_config_file(TINY, f"{SMALL_WORLD},rollout.max_context={needed - 1}"),
                     check_files=False)
    with pytest.raises(ConfigError, match=f"rollout.max_context = {needed - 1}: the longest"):
        check_prompts_fit(short, assets)


def test_batches_the_host_cannot_hold_are_refused_naming_the_fields():
    from matpo_jax.run.startup_checks import PACKED_BYTES_PER_TOKEN, check_batches_fit_host
    cfg = to_typed(load_config_file(TINY, "rl.pack_rows=100000,rl.pack_len=100000,"
                                          "rollout.max_context=1024"), check_files=False)
    need = 100000 * 100000 * PACKED_BYTES_PER_TOKEN
    # The GiB figure follows PackedBatch's fields (each new field adds 4 bytes a token).
    with pytest.raises(ConfigError, match=r"rl.pack_rows = 100000 x rl.pack_len = 100000: one "
                                          rf"packed batch of 100000 rows needs {need / 2**30:.1f} "
                                          r"GiB of host memory, more than this host's 64.0 GiB"):
        check_batches_fit_host(cfg, host_bytes=64 * 2**30)
    check_batches_fit_host(cfg, host_bytes=need)  # exactly one batch fits
    sft = to_typed(load_config_file(TINY, "sft.batch_size=10000000"), check_files=False)
    with pytest.raises(ConfigError, match=r"sft.batch_size = 10000000 x rl.pack_len = 1024"):
        check_batches_fit_host(sft, host_bytes=64 * 2**30)
