"""notebooks/matpo_small_repro.ipynb executed top to bottom in a real Jupyter kernel at tiny
settings (its parameters cell overridden), from a checkout; and its install cell in a fresh
directory, cloning the repository URL it is given."""
import json
import os
import subprocess

import nbformat
import pytest
from nbclient import NotebookClient

from matpo_jax.report.metrics import load_metrics, series
from fixtures.xla import xla_flags

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


def run_notebook(cwd, cells=None, skip=(), **parameters):
    """Executes the notebook (or its first `cells` cells, less the cells numbered in `skip`) with
    the parameters cell's values overridden; returns the executed notebook."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells = [c for i, c in enumerate(nb.cells[:cells] if cells else nb.cells) if i not in skip]
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
    monkeypatch.setenv("XLA_FLAGS", xla_flags(devices=1))


# configs/qwen3_0_6b_synthetic.py at seconds on a CPU with the tiny checkpoint (its config.json
# gives the model): the same world as TINY (shared data_dir), tiny budgets; 2 RL steps with an
# evaluation every step, so the curve has a point between the SFT and the final evaluations.
QWEN3_TINY = ",".join([
    "data.num_entities=40", "data.num_questions=120", "data.max_hops=2", "data.batch_size=2",
    "rollout.group_size=2", "rollout.max_new_tokens_per_turn=8", "rollout.max_turns_planner=2",
    "rollout.max_turns_worker=2", "rollout.decode_slots=8", "rollout.final_summary_max_tokens=8",
    "rl.pack_rows=2", "sft.steps=2", "sft.num_demos=8", "sft.batch_size=2", "train.remat=none",
    "train.steps=2", "train.eval_every=1", "train.checkpoint_every=2",
    "train.async_checkpointing=false", "eval.num_questions=2", "eval.curve_questions=2",
])


# configs/smollm2_synthetic.py with the real model at the least that runs its phases: no SFT
# (zero-shot start), one RL step of 2 x 2 rollouts, 2 validation questions, 1,024-token rows.
SMOLLM2_TINY = ",".join([
    "data.num_entities=40", "data.num_questions=120", "data.max_hops=2", "data.batch_size=2",
    "rollout.group_size=2", "rollout.max_new_tokens_per_turn=8", "rollout.max_turns_planner=2",
    "rollout.max_turns_worker=2", "rollout.decode_slots=8", "rollout.final_summary_max_tokens=8",
    "rollout.max_context=1024", "rl.pack_len=1024", "rl.pack_rows=2", "rl.micro_batches=1",
    "sft.steps=0", "sft.num_demos=0", "train.steps=1", "train.eval_every=0",
    "train.checkpoint_every=1", "train.async_checkpointing=false", "eval.num_questions=2",
    "eval.curve_questions=2",
])


def test_notebook_runs_top_to_bottom_from_a_checkout(tmp_path, qwen3_compact_checkpoint,
                                                     one_device_kernel):
    workdir, qwen3_workdir, data_dir = tmp_path / "run", tmp_path / "qwen3", tmp_path / "tfds"
    nb = run_notebook(os.path.join(REPO, "notebooks"),  # where `jupyter lab notebooks/` starts it
                      OVERRIDES=TINY + f",data.data_dir={data_dir}", WORKDIR=str(workdir),
                      SMOLLM2_RUN=False,  # its own test below (the real model's memory apart)
                      QWEN3_CHECKPOINT=qwen3_compact_checkpoint.path, QWEN3_ON_CPU=True,
                      QWEN3_OVERRIDES=QWEN3_TINY + f",data.data_dir={data_dir}",
                      QWEN3_WORKDIR=str(qwen3_workdir))
    text = outputs(nb)
    assert f"matpo_jax from {REPO}" in text
    assert text.count("| validation | after SFT | after MATPO |") == 2  # both runs' tables
    assert "the SmolLM2 run is skipped" in text
    assert os.path.isfile(workdir / "plots" / "overview.png")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(workdir / "hf"))
    # The Qwen3 section ran configs/qwen3_0_6b_synthetic.py from the checkpoint (its config
    # recorded by the run), and drew the validation curve of its SFT start and 2 RL steps.
    assert f"configs/qwen3_0_6b_synthetic.py from {qwen3_compact_checkpoint.path}" in text
    with open(qwen3_workdir / "config.json") as f:
        model = json.load(f)["model"]
    assert (model["hf_checkpoint"], model["dtype"], model["param_dtype"]) == (
        qwen3_compact_checkpoint.path, "bfloat16", "float32")
    steps, accuracy = series(load_metrics(qwen3_workdir / "metrics.jsonl"), "curve/accuracy")
    assert steps.tolist() == [0, 1, 2] and ((0 <= accuracy) & (accuracy <= 1)).all()
    assert "validation curve: step 0: " in text and ", step 2: " in text
    assert os.path.getsize(qwen3_workdir / "plots" / "validation_curve.png") > 10_000
    curve_cell = next(c for c in nb.cells if "validation_curve.png" in c.source)
    assert any("image/png" in o.get("data", {}) for o in curve_cell.outputs)  # shown inline


def test_the_smollm2_section_trains_the_real_model_on_a_cpu_runtime(tmp_path, smollm2_dir,
                                                                    one_device_kernel):
    # Its cells alone (the first run's and the Qwen3 section's left out): the converted real
    # model (its weights' sha256 checked by the config), one MATPO step, the table and overview.
    nb = nbformat.read(NOTEBOOK, as_version=4)
    first_run = next(i for i, c in enumerate(nb.cells) if "run_experiment(cfg, WORKDIR)" in c.source)
    smollm2 = next(i for i, c in enumerate(nb.cells) if "SMOLLM2_RUN:" in c.source)
    qwen3 = next(i for i, c in enumerate(nb.cells) if "QWEN3_RUN =" in c.source)
    workdir = tmp_path / "smollm2"
    nb = run_notebook(os.path.join(REPO, "notebooks"),
                      skip=[*range(first_run, smollm2 - 1), *range(qwen3 - 1, len(nb.cells))],
                      SMOLLM2_DIR=smollm2_dir, SMOLLM2_WORKDIR=str(workdir),
                      SMOLLM2_OVERRIDES=SMOLLM2_TINY + f",data.data_dir={tmp_path / 'tfds'}")
    text = outputs(nb)
    assert "configs/smollm2_synthetic.py on 1 cpu device(s): 0 SFT steps, 1 RL steps" in text
    assert "| validation | after SFT | after MATPO |" in text
    with open(workdir / "config.json") as f:
        model = json.load(f)["model"]
    assert model["hf_checkpoint"] == smollm2_dir and len(model["hf_checkpoint_sha256"]) == 64
    assert (workdir / "checkpoints" / "rl" / "1").is_dir()
    with open(workdir / "metrics.jsonl") as f:
        step = [json.loads(line) for line in f if '"time_update_s"' in line]
    # The RL update ran on the step's packed rollouts (a zero-shot start earns no reward, so it is
    # an all-zero-advantage step: the optimizer still steps).
    assert len(step) == 1 and step[0]["optimizer_steps"] == 1 and step[0]["packed_rows"] >= 1
    shown = next(c for c in nb.cells if 'smollm2_summary["final_eval"]' in c.source)
    assert any("image/png" in o.get("data", {}) for o in shown.outputs)


def test_without_an_accelerator_the_qwen3_section_is_skipped(tmp_path, one_device_kernel):
    # A CPU-only runtime (QWEN3_ON_CPU left off): the Qwen3 cells neither download the checkpoint
    # nor run; the first section's run is left out here (its cells are tested above).
    nb = nbformat.read(NOTEBOOK, as_version=4)
    first_run = next(i for i, c in enumerate(nb.cells) if "run_experiment(cfg, WORKDIR)" in c.source)
    qwen3 = next(i for i, c in enumerate(nb.cells) if "QWEN3_RUN =" in c.source)
    nb = run_notebook(os.path.join(REPO, "notebooks"), skip=range(first_run, qwen3 - 1),
                      QWEN3_CHECKPOINT="Qwen/Qwen3-0.6B", QWEN3_WORKDIR=str(tmp_path / "qwen3"))
    assert "the Qwen3 run is skipped" in outputs(nb)
    assert not any(o.output_type == "error" for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert not (tmp_path / "qwen3").exists()


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
