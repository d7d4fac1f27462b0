"""notebooks/matpo_small_repro.ipynb executed top to bottom in a real Jupyter kernel at tiny
settings (its parameters cell overridden), from a checkout; and its install cell in a fresh
directory, cloning the repository URL it is given."""
import os
import subprocess

import nbformat
import pytest
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(REPO, "notebooks", "matpo_small_repro.ipynb")
# synthetic_tiny shrunk to seconds (as tests/run/test_end_to_end.py): tiny model, world, budgets.
TINY = ",".join([
    "model.arch.hidden_size=32", "model.arch.intermediate_size=64",
    "model.arch.num_hidden_layers=1", "model.arch.num_attention_heads=2",
    "model.arch.num_key_value_heads=1", "model.arch.head_dim=16", "model.arch.vocab_size=1024",
    "data.num_entities=40", "data.num_questions=120", "data.max_hops=2", "data.batch_size=2",
    "rollout.group_size=2", "rollout.max_new_tokens_per_turn=16", "rollout.max_turns_planner=2",
    "rollout.max_turns_worker=2", "rollout.decode_slots=8", "rollout.max_context=768",
    "rl.pack_len=768", "rl.pack_rows=2",
    "sft.steps=2", "sft.num_demos=8", "sft.batch_size=2",
    "train.steps=1", "train.checkpoint_every=1", "train.eval_every=0",
    "train.async_checkpointing=false", "eval.num_questions=2",
])


def run_notebook(cwd, cells=None, **parameters):
    """Executes the notebook (or its first `cells` cells) with the parameters cell's values
    overridden; returns the executed notebook."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells = nb.cells[:cells] if cells else nb.cells
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    params[0].source += "\n# test overrides\n" + "".join(f"{k} = {v!r}\n" for k, v in
                                                        parameters.items())
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def outputs(nb) -> str:
    return "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                     + str(o.get("data", {}).get("text/markdown", ""))
                     for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)


@pytest.fixture
def one_device_kernel(monkeypatch):
    """The kernel sees one CPU device (the test session simulates 8: sharding a tiny model 8 ways
    on 2 cores only multiplies compile time)."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")


def test_notebook_runs_top_to_bottom_from_a_checkout(tmp_path, qwen3_compact_checkpoint,
                                                     one_device_kernel):
    workdir = tmp_path / "run"
    nb = run_notebook(os.path.join(REPO, "notebooks"),  # where `jupyter lab notebooks/` starts it
                      OVERRIDES=TINY + f",data.data_dir={tmp_path / 'tfds'}", WORKDIR=str(workdir),
                      QWEN3_CHECKPOINT=qwen3_compact_checkpoint.path, QWEN3_ON_CPU=True,
                      QWEN3_NEW_TOKENS=8)
    text = outputs(nb)
    assert f"matpo_jax from {REPO}" in text
    assert "| validation | after SFT | after MATPO |" in text
    assert os.path.isfile(workdir / "plots" / "overview.png")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(workdir / "hf"))
    assert "prompt tokens; Qwen3 wrote" in text  # the real-checkpoint section ran (on CPU)


def test_install_cell_clones_the_configured_repository(tmp_path):
    # A fresh runtime (no checkout above the working directory) cloning REPO_URL; the clone
    # comes from this checkout's committed history, so it is offline.
    assert subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True).returncode == 0
    nb = run_notebook(tmp_path, cells=3, REPO_URL=f"file://{REPO}", INSTALL=False)
    assert f"matpo_jax from {tmp_path / 'matpo_jax'}" in outputs(nb)
    assert os.path.isfile(tmp_path / "matpo_jax" / "notebooks" / "matpo_small_repro.ipynb")
    # Without a URL the cell stops with one line saying what to set.
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="set REPO_URL"):
        run_notebook(tmp_path / "empty", cells=3, REPO_URL="")
