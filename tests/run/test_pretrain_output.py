"""Issue 48 item 8: `python -m matpo_jax.pretrain` without --out used to overwrite the committed warm
start (warm_starts/synthetic_tiny), after which `make demo` stopped on the hash with a message
offering to adopt the broken file's hash. Now the default is used only while it holds nothing,
any --out must be new, empty or an earlier warm start (checked before training), and the hash
error says to restore the weights, never to adopt them."""
from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys

import pytest

from matpo_jax.config import ConfigError, apply_overrides, load_config_file, to_typed

from test_pretrain import REPO, SHRUNK, TINY

COMMITTED = os.path.join(REPO, "warm_starts", "synthetic_tiny")


def pretrain(cwd, workdir, *flags):
    return subprocess.run(
        [sys.executable, "-m", "matpo_jax.pretrain", f"--config={TINY}:{SHRUNK},"
         f"data.data_dir={workdir / 'tfds'}", f"--workdir={workdir}", *flags],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO))


def test_pretrain_without_out_never_replaces_the_committed_warm_start(tmp_path):
    checkout = tmp_path / "checkout"  # a checkout's warm_starts/, as the repository commits it
    shutil.copytree(COMMITTED, checkout / "warm_starts" / "synthetic_tiny")
    done = pretrain(checkout, tmp_path / "work")
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "FATAL config error: --out not given, and its default warm_starts/synthetic_tiny holds "
        "a warm start already (the committed one configs pin by model.hf_checkpoint_sha256): "
        "pass --out=DIR for a new warm start, or --out=warm_starts/synthetic_tiny to replace "
        "that one on purpose"]
    compared = filecmp.dircmp(COMMITTED, checkout / "warm_starts" / "synthetic_tiny")
    assert not (compared.diff_files or compared.left_only or compared.right_only)
    assert not (tmp_path / "work" / "checkpoints").exists()  # refused before any training


def test_pretrain_refuses_a_directory_it_did_not_write_before_training(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("not a warm start")
    done = pretrain(REPO, tmp_path / "work", f"--out={out}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"FATAL config error: --out={out} is not empty and pretrain did not write it (it holds "
        "notes.txt; no warm_start.json): files of others would mix with its own; write to a new "
        "or empty directory"]
    assert os.listdir(out) == ["notes.txt"]
    assert not (tmp_path / "work" / "checkpoints").exists()


def test_a_replaced_warm_start_is_to_be_restored_not_adopted(tmp_path):
    copy = tmp_path / "synthetic_tiny"
    shutil.copytree(COMMITTED, copy)
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(weights))
    demo = load_config_file(os.path.join(REPO, "configs", "synthetic_demo.py"))
    pinned = to_typed(demo)
    with pytest.raises(ConfigError) as refused:
        to_typed(apply_overrides(demo, {"model.hf_checkpoint": str(copy)}))
    message = str(refused.value)
    assert pinned.model.hf_checkpoint_sha256 in message and "restore them" in message
    assert "set the field" not in message and "hash)" not in message
