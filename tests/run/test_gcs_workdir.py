"""A run's files on a gs:// workdir, against a real GCS server on 127.0.0.1 (fake-gcs-server, see
fixtures/gcs_emulator.py): each writer puts objects with the right content, the readers of a
resume read them back, and nothing lands in a local ./gs:/ folder. Every object is read back
through the server's own API, not through the code under test."""
from __future__ import annotations

import json
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fixtures.gcs_emulator import gcs_root, gcs_server, list_objects, read_object  # noqa: F401

from matpo_jax import config as config_lib
from matpo_jax.config import ConfigError, load_config_file, to_typed
from matpo_jax.config.files import config_as_json
from matpo_jax.report import files, plots
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.run.eval.benchmark import evaluate_dataset
from matpo_jax.run.eval.grading import Grader
from matpo_jax.run.eval.results import RESULTS_FILE, TRANSCRIPTS_FILE
from matpo_jax.run.eval import summary as summary_lib
from matpo_jax.run.experiment import world_data_dir
from test_benchmark_eval import K, QUESTIONS, ScriptedPolicy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "configs", "synthetic_tiny.py")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Run from an empty folder: a gs:// path mistaken for a local one would show up as ./gs:."""
    monkeypatch.chdir(tmp_path)
    yield
    assert not os.path.exists(tmp_path / "gs:"), "a gs:// path was written as a local folder"


def jsonl(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines()]


def tensorboard_events(data: bytes):
    """The Event protos of a TensorBoard event file (TFRecord framing)."""
    from tensorboardX.proto import event_pb2

    events, at = [], 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at:at + 8])
        events.append(event_pb2.Event.FromString(data[at + 12:at + 12 + length]))
        at += 12 + length + 4
    return events


def test_config_record_and_resume_check_on_gcs(gcs_server, gcs_root):
    workdir = f"{gcs_root}/run"
    cfg = to_typed(load_config_file(TINY, "train.steps=3"))
    config_lib.save_config(cfg, workdir)
    assert json.loads(read_object(gcs_server, f"{workdir}/config.json")) == \
        config_as_json(cfg)
    assert config_lib.check_resume(cfg, workdir) == []  # the same run: resumes
    longer = to_typed(load_config_file(TINY, "train.steps=5"))
    with pytest.raises(ConfigError, match=rf"train.steps = 5, but the run in {workdir} has 3 "
                                          rf"\({workdir}/config.json\)"):
        config_lib.check_resume(longer, workdir)
    assert config_lib.check_resume(longer, workdir, "train.steps") == ["train.steps"]
    assert config_lib.check_resume(cfg, f"{gcs_root}/fresh") == []  # nothing there yet


def test_metrics_tensorboard_and_plots_on_gcs_with_resume_cut_back(gcs_server, gcs_root):
    workdir = f"{gcs_root}/run"
    metrics_path = f"{workdir}/{metrics_lib.METRICS_FILE}"
    with metrics_lib.MetricsWriter(workdir) as writer:
        for step in (1, 2, 3):
            writer.write(step, {"loss": 1.0 / step, "reward/mean/planner": 0.1 * step})
            # written and flushed per call: the object holds every record so far
            assert [r["step"] for r in jsonl(read_object(gcs_server, metrics_path))] == \
                list(range(1, step + 1))
        writer.write_text(3, "sample", "a decoded rollout")
    assert [r["loss"] for r in jsonl(read_object(gcs_server, metrics_path))] == [1.0, 0.5, 1 / 3]
    (event_file,) = [n for n in list_objects(gcs_server, f"{workdir}/tensorboard/")]
    events = tensorboard_events(read_object(gcs_server, event_file))
    scalars = {(e.step, v.tag): v.simple_value for e in events for v in e.summary.value
               if v.HasField("simple_value")}
    assert scalars[(2, "loss")] == pytest.approx(0.5) and (3, "reward/mean/planner") in scalars
    assert any(v.tag.startswith("sample") for e in events if e.step == 3 for v in e.summary.value)

    # A resume from step 1's checkpoint: the crashed run's steps 2 and 3 are cut off, then redone.
    with metrics_lib.MetricsWriter(workdir, resume_step=1) as writer:
        assert [r["step"] for r in jsonl(read_object(gcs_server, metrics_path))] == [1]
        writer.write(2, {"loss": 0.25})
        writer.truncate_after(1)
        writer.write(2, {"loss": 0.2})
        writer.write(3, {"loss": 0.1})
    records = metrics_lib.load_metrics(metrics_path)  # read back through the gs:// reader
    assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 0.2), (3, 0.1)]
    # The resumed writer's event file (a new one; named by the second it was opened in).
    events = [e for name in list_objects(gcs_server, f"{workdir}/tensorboard/")
              for e in tensorboard_events(read_object(gcs_server, name))]
    assert any(e.step == 3 and v.tag == "loss" and v.simple_value == pytest.approx(0.1)
               for e in events for v in e.summary.value)

    written = plots.plot_run(metrics_path, f"{workdir}/plots")
    assert str(written["overview"]) == f"{workdir}/plots/overview.png"
    assert read_object(gcs_server, f"{workdir}/plots/overview.png")[:8] == b"\x89PNG\r\n\x1a\n"


def test_whole_and_appended_files_on_gcs(gcs_server, gcs_root):
    workdir = f"{gcs_root}/run"
    summary = {"final_eval": {"eval/accuracy": 0.5}, "workdir": files.absolute(workdir)}
    assert files.write_json_atomic(f"{workdir}/summary.json", summary, indent=1).exists()
    assert json.loads(read_object(gcs_server, f"{workdir}/summary.json")) == \
        {"final_eval": {"eval/accuracy": 0.5}, "workdir": workdir}
    files.write_text_atomic(f"{workdir}/eval/sft_samples.txt", "one\ntwo\n")
    assert read_object(gcs_server, f"{workdir}/eval/sft_samples.txt") == b"one\ntwo\n"

    # consumed.jsonl as run/rl.py writes it: a line per step, flushed; a resumed run appends.
    consumed = f"{workdir}/consumed.jsonl"
    with files.open_append(consumed) as f:
        f.write(json.dumps({"step": 1, "ids": [3, 4]}) + "\n")
        f.flush()
        assert jsonl(read_object(gcs_server, consumed)) == [{"step": 1, "ids": [3, 4]}]
        f.write(json.dumps({"step": 2, "ids": [5, 6]}) + "\n")
    with files.open_append(consumed) as f:
        f.write(json.dumps({"step": 3, "ids": [7, 8]}) + "\n")
    assert [r["step"] for r in jsonl(read_object(gcs_server, consumed))] == [1, 2, 3]

    # The world's records, corpus and tokenizer must be local files: a local stand-in folder.
    data = to_typed(load_config_file(TINY)).data
    local = world_data_dir(data, workdir)
    assert "://" not in local and local.endswith(os.path.join(
        "matpo_jax", "gs", *workdir.removeprefix("gs://").split("/"), "tfds"))
    assert world_data_dir(data, "runs/x") == os.path.join("runs/x", "tfds")  # local: as before


def test_interrupted_benchmark_evaluation_resumes_on_gcs(gcs_server, gcs_root, tmp_path):
    """The same evaluation as test_benchmark_eval's, with its crash and resume on gs://: the
    objects equal the local uninterrupted run's files byte for byte."""
    grader = Grader("exact")
    straight = evaluate_dataset(QUESTIONS, ScriptedPolicy(), grader, samples=K,
                                   out_dir=str(tmp_path / "straight"), batch_size=3)
    out = f"{gcs_root}/bench/gaia"
    with pytest.raises(KeyboardInterrupt):
        evaluate_dataset(QUESTIONS, ScriptedPolicy(stop_after=1), grader, samples=K,
                            out_dir=out, batch_size=3)
    assert len(jsonl(read_object(gcs_server, f"{out}/{RESULTS_FILE}"))) == 3
    # A crash in the middle of the next batch's writes: a transcript without its result, and
    # half a result line.
    files.append_text(f"{out}/{TRANSCRIPTS_FILE}",
                      json.dumps({"id": "t3", "sample": 0, "agents": []}) + "\n")
    files.append_text(f"{out}/{RESULTS_FILE}", '{"id": "t3", "question": "What is ans')
    policy = ScriptedPolicy()
    resumed = evaluate_dataset(QUESTIONS, policy, grader, samples=K, out_dir=out,
                                  batch_size=3)
    assert [b for b, _ in policy.calls] == [1, 2]  # only the unfinished batches ran
    assert resumed == straight
    for name in (RESULTS_FILE, TRANSCRIPTS_FILE):
        assert read_object(gcs_server, f"{out}/{name}") == \
            (tmp_path / "straight" / name).read_bytes()
    summaries = {"gaia": summary_lib.summarize(resumed)}
    table = summary_lib.write_report(f"{gcs_root}/bench", summaries, "# header")
    assert read_object(gcs_server, f"{gcs_root}/bench/{summary_lib.REPORT_MD}").decode() \
        == "# header\n\n" + table
    report_json = f"{gcs_root}/bench/{summary_lib.REPORT_JSON}"
    numbers = json.loads(read_object(gcs_server, report_json))
    assert numbers["gaia"]["all"]["avg_at_k"] == pytest.approx(0.5)


def test_orbax_checkpoints_on_gcs(gcs_server, gcs_root):
    """The trainer's Checkpointer (Orbax; arrays through tensorstore's GCS driver) saves to and
    restores from the same server."""
    from matpo_jax.trainer import checkpoint as ckpt_lib

    directory = f"{gcs_root}/run/checkpoints/rl"
    params = {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4), "b": jnp.ones(3)}
    opt_state = {"mu": jnp.zeros(3)}
    with ckpt_lib.Checkpointer(directory, async_save=False) as checkpoints:
        checkpoints.save(1, params=params, opt_state=opt_state, rng=jax.random.key(1),
                         data_state={"position": 4})
        checkpoints.save(2, params=jax.tree.map(lambda x: x * 2, params), opt_state=opt_state,
                         rng=jax.random.key(2), data_state={"position": 6})
    assert any(n.startswith(f"{directory}/2/params/") for n in list_objects(gcs_server, directory))
    assert not os.path.exists(directory)  # not a local folder either
    with ckpt_lib.Checkpointer(directory, async_save=False) as checkpoints:
        assert checkpoints.all_steps() == [1, 2]
        restored = checkpoints.restore_latest(params, opt_state)
    assert restored.step == 2 and restored.data_state == {"position": 6}
    np.testing.assert_array_equal(np.asarray(restored.params["w"]), np.asarray(params["w"]) * 2)


def test_tiny_run_on_gcs_workdir_and_its_rerun_resumes_from_there(gcs_server, gcs_root, tmp_path,
                                                                 compilation_cache_dir):
    """The whole job (synthetic_tiny shrunk as test_end_to_end shrinks it, fewer steps) with its
    workdir on gs://; the same command again resumes from what is there: it reads config.json,
    the checkpoints and the evaluations back and trains nothing again."""
    from test_end_to_end import shrink

    from matpo_jax.run.experiment import run_experiment

    workdir = f"{gcs_root}/run"
    overrides = shrink(str(tmp_path / "tfds"), 1) + ",sft.steps=2,eval.num_questions=2"
    cfg = to_typed(load_config_file(TINY, overrides))
    summary = run_experiment(cfg, workdir)
    assert summary["workdir"] == workdir
    names = set(list_objects(gcs_server, workdir))
    for name in ("config.json", "summary.json", "metrics.jsonl", "consumed.jsonl",
                 "sft/metrics.jsonl", "eval/sft.json", "eval/final.json", "eval/sft_samples.txt",
                 "eval/final_samples.txt", "plots/overview.png", "plots/sft.png"):
        assert f"{workdir}/{name}" in names, name
    for prefix in ("tensorboard/events.", "sft/tensorboard/events.", "checkpoints/sft/2/params/",
                   "checkpoints/rl/1/params/"):
        assert any(n.startswith(f"{workdir}/{prefix}") for n in names), prefix
    assert json.loads(read_object(gcs_server, f"{workdir}/summary.json")) == summary
    assert [r["step"] for r in jsonl(read_object(gcs_server, f"{workdir}/consumed.jsonl"))] == [1]
    metrics = read_object(gcs_server, f"{workdir}/metrics.jsonl")

    assert run_experiment(cfg, workdir) == summary  # evaluations read back, not run again
    assert [r["step"] for r in jsonl(read_object(gcs_server, f"{workdir}/consumed.jsonl"))] == [1]
    records = metrics_lib.load_metrics(f"{workdir}/metrics.jsonl")
    assert [r["step"] for r in records if "loss" in r] == [1]  # RL step 1 not trained again
    # the cached evaluations (steps 0 and 1) are not logged again: one row each
    assert jsonl(read_object(gcs_server, f"{workdir}/metrics.jsonl")) == jsonl(metrics)
    with pytest.raises(ConfigError, match=f"the run in {workdir} has"):
        run_experiment(to_typed(load_config_file(TINY, overrides + ",rl.lr=0.5")), workdir)

    # Export reads the gs:// run (config.json, the Orbax checkpoint) and writes a gs:// folder.
    from safetensors.numpy import load as load_safetensors

    from matpo_jax.run.export import export_checkpoint

    out = f"{gcs_root}/export"
    exported = export_checkpoint(f"{workdir}/checkpoints/rl", out)
    assert exported.step == 1
    exported_names = {f"{out}/{name}" for name in ("config.json", "model.safetensors",
                                                   "tokenizer.json", "generation_config.json")}
    assert exported_names <= set(list_objects(gcs_server, out))
    weights = load_safetensors(read_object(gcs_server, f"{out}/model.safetensors"))
    assert json.loads(read_object(gcs_server, f"{out}/config.json"))["hidden_size"] == 32
    assert all(np.isfinite(w).all() for w in weights.values()) and len(weights) > 5

    # The benchmark job reads the gs:// run's newest checkpoint and writes its outputs to gs://.
    from matpo_jax.run.eval import job as eval_job

    bench = f"{gcs_root}/bench"
    numbers = eval_job.run_benchmarks(cfg, eval_job.BenchmarkOptions(
        datasets=["synthetic_multihop"], workdir=bench, checkpoint=f"{workdir}/checkpoints/rl",
        num_questions=2, grader="exact"))
    assert numbers["synthetic_multihop"]["all"]["questions"] == 2
    results = jsonl(read_object(gcs_server, f"{bench}/synthetic_multihop/{RESULTS_FILE}"))
    assert len(results) == 2 and all(r["grader"] == "exact" for r in results)
    assert len(jsonl(read_object(gcs_server, f"{bench}/synthetic_multihop/"
                                             f"{TRANSCRIPTS_FILE}"))) == 2
    report = read_object(gcs_server, f"{bench}/{summary_lib.REPORT_MD}").decode()
    assert "| synthetic_multihop | all | 2 |" in report
    # The synthetic world's wrong answers traced to their first failed step, beside the transcripts
    # and in the report: every sample counted once.
    from matpo_jax.run.eval import failures
    diagnosis = json.loads(read_object(gcs_server, f"{bench}/synthetic_multihop/"
                                                   f"{failures.FAILURES_JSON}"))
    assert diagnosis["samples"] == 2 and sum(r["samples"] for r in diagnosis["rows"]) == 2
    table = read_object(gcs_server, f"{bench}/synthetic_multihop/{failures.FAILURES_MD}").decode()
    assert "| first failed step |" in table and table in report


def test_a_gcs_workdir_that_cannot_be_written_is_one_line(gcs_server, gcs_root):
    from matpo_jax.config.cli import check_workdir

    assert check_workdir(f"{gcs_root}/run") == f"{gcs_root}/run"
    assert not list_objects(gcs_server, gcs_root)  # the probe object is gone again
    with pytest.raises(ConfigError, match=r"^--workdir=gs://no-such-bucket/run: cannot write "
                                          r"there \(.+\)$"):
        check_workdir("gs://no-such-bucket/run")
