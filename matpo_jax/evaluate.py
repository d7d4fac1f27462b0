"""Benchmark evaluation entry point: MATPO (or single-agent) inference over benchmark splits.

    python -m matpo_jax.evaluate --config=configs/qwen3_4b_musique.py --checkpoint=runs/4b \
        --datasets=gaia,frames,webwalkerqa --samples=4 --temperature=0.6 \
        --grader=judge --judge_url=http://127.0.0.1:8000/v1 --workdir=runs/4b/bench

Datasets are built from `data.manual_dir/<name>/` (the files as published; see data/*.py), or
named with a builder config: `gaia/all`, `musique/full`. Per-question results and transcripts go to
<workdir>/<dataset>/, the table to <workdir>/report.md. Re-running the same command resumes: the
questions with results are skipped, earlier judge failures are graded again; results of another
checkpoint, step or setting are never mixed in (each line records its source; another one is
refused), and a second evaluation on the workdir is refused while one runs (its lock). A
checkpoint is read only with the tokenizer it was trained with (run/provenance.py).
"""
from __future__ import annotations

from absl import app, flags, logging

from matpo_jax import config as config_lib

_CONFIG, _WORKDIR = config_lib.define_flags()
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A run's workdir, an Orbax checkpoint directory (or one step of it), or a "
    "Hugging Face directory. None: the model the config builds.")
_DATASETS = flags.DEFINE_list("datasets", None, "Datasets to evaluate (default: eval.datasets).")
_SAMPLES = flags.DEFINE_integer("samples", 1, "Answers sampled per question (avg@K, pass@K).")
_TEMPERATURE = flags.DEFINE_float("temperature", None, "Sampling temperature "
                                  "(default: eval.temperature).")
_GRADER = flags.DEFINE_enum("grader", None, ["exact", "f1", "judge"],
                            "How answers are graded (default: reward.method).")
_JUDGE_URL = flags.DEFINE_string("judge_url", None, "OpenAI-compatible base URL of the judge "
                                 "(default: reward.judge_url).")
_SPLIT = flags.DEFINE_string("split", None, "Split (default: each benchmark's evaluation split).")
_NUM_QUESTIONS = flags.DEFINE_integer("num_questions", 0, "The first N questions; 0: all.")
_CORPUS = flags.DEFINE_string("corpus", None, "JSONL corpus for the local search service.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", None, "Questions per rollout batch "
                                   "(default: rollout.decode_slots // samples).")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Keep third-party INFO logs (Orbax, TFDS...).")


@config_lib.one_line_errors
def main(argv):
    del argv
    workdir = config_lib.check_workdir(_WORKDIR.value)  # results, transcripts, report.md
    from matpo_jax.report import logs
    logs.configure(verbose=_VERBOSE.value)
    import jax
    import tensorflow_datasets as tfds
    if not _VERBOSE.value:
        tfds.disable_progress_bar()  # one bar per split and file of every dataset built

    cfg = config_lib.config_from_flags(_CONFIG, jax.device_count())
    from matpo_jax.data.published import DatasetFileError, DatasetRowError
    from matpo_jax.run.eval.job import BenchmarkOptions, run_benchmarks
    options = BenchmarkOptions(
        datasets=_DATASETS.value or list(cfg.eval.datasets), workdir=workdir,
        checkpoint=_CHECKPOINT.value, samples=_SAMPLES.value, grader=_GRADER.value,
        judge_url=_JUDGE_URL.value, split=_SPLIT.value, num_questions=_NUM_QUESTIONS.value,
        corpus=_CORPUS.value, batch_size=_BATCH_SIZE.value, temperature=_TEMPERATURE.value)
    try:
        numbers = run_benchmarks(cfg, options)
    except (DatasetFileError, DatasetRowError) as error:  # a published file: names file and row
        raise config_lib.ConfigError(str(error)) from error
    if jax.process_index() == 0:
        from matpo_jax.report.files import run_path
        print(run_path(workdir, "report.md").read_text(encoding="utf-8"))  # the table
        logging.info("%d dataset(s) evaluated", len(numbers))


if __name__ == "__main__":
    app.run(main, flags_parser=config_lib.flags_parser)
