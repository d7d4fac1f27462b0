"""Issue 48 items 2, 3, 4, 10 at `python -m matpo_jax.export`: a checkpoint is exported only with the
config and tokenizer of the run that wrote it; export never writes into a run's workdir or a
directory holding files it did not write (an earlier export's own files are replaced, nothing
else); a damaged newest checkpoint falls back to the newest readable one with one warning. Real
Orbax checkpoints of a tiny Qwen3 with Qwen3's tokenizer layout, read back by transformers."""
from __future__ import annotations

import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest
import optax
from flax import nnx

from matpo_jax import export as export_cli
from matpo_jax.chat import ChatFormat
from matpo_jax.config import apply_overrides, base_config, save_config
from matpo_jax.model import load_pretrained
from matpo_jax.run import provenance
from matpo_jax.run.export import EXPORT_MANIFEST
from matpo_jax.trainer.checkpoint import Checkpointer


def truncate_arrays(step_dir):
    """Half of every array data file of a step's params (as a disk-full or killed copy leaves
    them; tests/trainer/test_checkpoint_fallback.py damages checkpoints the same way)."""
    for f in (step_dir / "params").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def make_run(workdir, hf_path, steps=(1, 2), **fields):
    """A run's workdir as run_experiment leaves it: config.json, and RL checkpoints that record
    the run's identity as the training loop writes it (runtime.loop_config)."""
    cfg = apply_overrides(base_config(), {"model.hf_checkpoint": hf_path, **fields})
    save_config(cfg, workdir)
    identity = {provenance.IDENTITY_KEY: provenance.checkpoint_identity(
        cfg, ChatFormat.from_pretrained(hf_path))}
    _, start, _ = nnx.split(load_pretrained(hf_path), nnx.Param, ...)
    with Checkpointer(workdir / "checkpoints" / "rl", async_save=False) as checkpoints:
        for step in steps:
            params = jax.tree.map(lambda p, s=step: p + np.float32(0.01 * s), start)
            checkpoints.save(step, params=params, opt_state=optax.sgd(0.1).init(params),
                             metadata=identity, force=True)
    return workdir / "checkpoints" / "rl"


def export(checkpoint, out, *extra) -> int:
    return export_cli.main(["export", f"--checkpoint={checkpoint}", f"--out={out}", *extra])


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_a_checkpoint_under_another_runs_workdir_is_refused(tmp_path, qwen3_compact_checkpoint,
                                                            tokenizer_dir, capsys):
    """Item 2: run A's checkpoints/rl copied under run B's workdir used to export with B's
    config and tokenizer; the checkpoint now names the config it belongs to."""
    hf = qwen3_compact_checkpoint.path
    source = make_run(tmp_path / "a", hf, steps=(1,), **{"rl.lr": 3e-6})
    other = tmp_path / "b"
    save_config(apply_overrides(base_config(), {"model.hf_checkpoint": hf, "rl.lr": 0.5}), other)
    shutil.copytree(source, other / "checkpoints" / "rl")
    assert export(other / "checkpoints" / "rl", tmp_path / "hf") == 1
    err = one_line_error(capsys)
    assert "was written by another run than the one" in err and f"{other}/config.json" in err
    assert "rl.lr = 3e-06 vs 0.5" in err
    assert not (tmp_path / "hf").exists()
    # Its own run exports it; a tokenizer it was not trained with is refused.
    assert export(source, tmp_path / "hf") == 0
    assert export(source, tmp_path / "hf2", f"--tokenizer={tokenizer_dir}") == 1  # another's
    assert "was trained with another tokenizer" in one_line_error(capsys)
    assert not (tmp_path / "hf2").exists()


def test_export_never_writes_into_a_runs_workdir(tmp_path, qwen3_compact_checkpoint, capsys):
    """Item 3: --out=<the run's workdir> replaced the run's config.json with the Hugging Face
    one (exit 0); the run could neither resume nor be exported again."""
    workdir = tmp_path / "run"
    checkpoints = make_run(workdir, qwen3_compact_checkpoint.path)
    recorded = (workdir / "config.json").read_bytes()
    assert export(checkpoints, workdir) == 1
    err = one_line_error(capsys)
    assert f"--out={workdir} is a run's workdir (it holds checkpoints)" in err
    assert (workdir / "config.json").read_bytes() == recorded
    assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json"]
    assert export(checkpoints, workdir / "hf") == 0  # a new directory inside it is fine


def test_export_owns_its_directory_and_replaces_only_its_own_files(
        tmp_path, qwen3_compact_checkpoint, capsys):
    """Item 4: exporting into a non-empty directory kept a previous export's
    special_tokens_map.json and added_tokens.json: transformers then read eos <stale_eos> and
    more tokens than the model has (exit 0)."""
    import transformers

    checkpoints = make_run(tmp_path / "run", qwen3_compact_checkpoint.path)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<stale_eos>",
                                                             "pad_token": "<stale_pad>"}))
    (out / "added_tokens.json").write_text(json.dumps({"<stale_eos>": 900, "<stale_pad>": 901}))
    assert export(checkpoints, out) == 1
    err = one_line_error(capsys)
    assert "is not empty and export did not write it" in err
    assert "added_tokens.json, special_tokens_map.json" in err
    for name in ("special_tokens_map.json", "added_tokens.json"):
        (out / name).unlink()
    assert export(checkpoints, out) == 0  # empty: its own now
    manifest = json.loads((out / EXPORT_MANIFEST).read_text())
    assert manifest["step"] == 2 and manifest["source"]["step"] == 2
    assert set(manifest["files"]) == set(os.listdir(out)) - {EXPORT_MANIFEST}
    assert manifest["tokenizer_sha256"] == provenance.read_identity(
        str(checkpoints), 2)["tokenizer_sha256"]
    # Readable by others: the umask's modes, not 0600 (item 11).
    assert os.stat(out / "model.safetensors").st_mode & 0o777 == 0o666 & ~_umask()
    # A file someone else put beside an export is refused; the export's own are replaced.
    (out / "notes.txt").write_text("mine")
    assert export(checkpoints, out, "--step=1") == 1
    assert "holds files export did not write (notes.txt" in one_line_error(capsys)
    (out / "notes.txt").unlink()
    assert export(checkpoints, out, "--step=1") == 0
    assert json.loads((out / EXPORT_MANIFEST).read_text())["step"] == 1
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert len(tokenizer) == len(transformers.AutoTokenizer.from_pretrained(
        qwen3_compact_checkpoint.path))
    assert not [n for n in os.listdir(tmp_path) if ".partial-" in n]  # no staging left


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_damaged_newest_checkpoint_falls_back_with_one_warning(
        tmp_path, qwen3_compact_checkpoint, capsys, caplog):
    """Item 10: a truncated newest step stopped export with a 137-line tensorstore traceback
    although the step before was intact (train already fell back)."""
    checkpoints = make_run(tmp_path / "run", qwen3_compact_checkpoint.path)
    truncate_arrays(checkpoints / "2")
    with caplog.at_level(logging.WARNING):
        assert export(checkpoints, tmp_path / "hf") == 0
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("matpo_jax")]
    assert len(warnings) == 1 and f"{checkpoints}/2 is unreadable" in warnings[0]
    assert "exporting step 1" in warnings[0]
    assert json.loads((tmp_path / "hf" / EXPORT_MANIFEST).read_text())["step"] == 1
    assert sorted(os.listdir(checkpoints)) == ["1", "2"]  # the run's files untouched
    # The damaged step asked for by name: one line, not a traceback.
    assert export(checkpoints, tmp_path / "hf2", "--step=2") == 1
    assert f"{checkpoints}/2 does not restore" in one_line_error(capsys)


def test_a_run_config_replaced_by_a_model_config_is_named_as_such(tmp_path,
                                                                   qwen3_compact_checkpoint):
    """Item 3's aftermath: a workdir whose config.json an older export replaced could not resume,
    with 44 "has '<absent>'" lines that never said why; now one line says what happened."""
    from matpo_jax.config import ConfigError, check_resume, to_typed

    workdir = tmp_path / "run"
    make_run(workdir, qwen3_compact_checkpoint.path, steps=(1,))
    shutil.copyfile(os.path.join(qwen3_compact_checkpoint.path, "config.json"),
                    workdir / "config.json")  # what `export --out=<workdir>` used to do
    cfg = to_typed(apply_overrides(base_config(), {
        "model.hf_checkpoint": qwen3_compact_checkpoint.path}), check_files=False)
    with pytest.raises(ConfigError) as refused:
        check_resume(cfg, str(workdir))
    assert str(refused.value) == (
        f"{workdir}/config.json: not a run's config (a model config: model_type 'qwen3'), though "
        "it is where the run in this workdir records its config: it was replaced; restore it or "
        "use a new --workdir")
