"""What an evaluator asks: questions with their accepted answers and the groups they report in."""
from __future__ import annotations

import dataclasses
from typing import Sequence

from matpo_jax.config import ExperimentConfig
from matpo_jax.data import loader as loader_lib
from matpo_jax.data import world_assets as world_assets_lib


@dataclasses.dataclass(frozen=True)
class BenchmarkQuestion:
    id: str
    question: str
    answers: list[str]  # accepted answers, the canonical one first
    categories: dict[str, list[str]]  # e.g. {"level": ["2"]}; a question may be in several


def _label(value) -> str:
    """Category values that differ only by case or separator are one group."""
    return str(value).strip().lower().replace("-", "_")


def categories_of(dataset: str, record: dict) -> dict[str, list[str]]:
    """The groups a question is reported in: level (GAIA), reasoning type (FRAMES, several per
    question), difficulty and source type (WebWalkerQA), hop count (MuSiQue, synthetic)."""
    if dataset == "gaia":
        return {"level": [str(record["level"])]}
    if dataset == "frames":
        return {"reasoning_type": [_label(t) for t in record["reasoning_types"]]}
    if dataset == "webwalkerqa":
        return {"difficulty": [_label(record["difficulty_level"])],
                "type": [_label(record["type"])]}
    if "hops" in record:
        return {"hops": [str(record["hops"])]}
    return {}


def benchmark_questions(dataset: str, records: Sequence[dict]) -> list[BenchmarkQuestion]:
    """Decoded loader records (data.loader.decode_record) as questions; ids must be unique."""
    out, seen = [], set()
    for record in records:
        answers = list(record["answers"]) if "answers" in record else [record["answer"]]
        if record["id"] in seen:
            raise ValueError(f"{dataset}: question id {record['id']!r} appears twice")
        seen.add(record["id"])
        out.append(BenchmarkQuestion(id=record["id"], question=record["question"],
                                     answers=answers, categories=categories_of(dataset, record)))
    return out


def load_questions(cfg: ExperimentConfig, name: str, config, *, split: str | None,
                   num_questions: int, data_dir: str) -> list[BenchmarkQuestion]:
    """The first `num_questions` (0: all) of dataset `name` (builder config `config`), of `split`
    (None: the benchmark's own evaluation split; eval.split for the synthetic world)."""
    if name == loader_lib.SYNTHETIC:
        config = world_assets_lib.world_config(cfg)
    split = split or (cfg.eval.split if name == loader_lib.SYNTHETIC else None)
    source = loader_lib.question_source(name, split, data_dir=data_dir,
                                        manual_dir=cfg.data.manual_dir, config=config)
    count = len(source) if num_questions <= 0 else min(len(source), num_questions)
    records = [loader_lib.decode_record(source[i]) for i in range(count)]
    return benchmark_questions(name, records)
