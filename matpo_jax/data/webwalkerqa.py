"""TFDS builder for WebWalkerQA (Wu et al., 2025), from its published JSONL files.

    builder = prepare_dataset(manual_dir=D, data_dir=DATA)
    source = tfds.data_source("webwalkerqa", data_dir=DATA)["main"]

Files (https://huggingface.co/datasets/callanwu/WebWalkerQA), at the top of the manual dir or
under data/ as published: main-00000-of-00001.jsonl (the 680 benchmark questions, split `main`)
and silver-00000-of-00001.jsonl (split `silver`; optional, left out when its file is missing).
Rows use the current lower-case keys (question, answer, root_url, info{domain, lang, type,
difficulty_level, source_website, golden_path}) or the first release's capitalised ones
(Question, Answer, Root_Url, Info{Hop, Domain, Language, Difficulty_Level, Source_Website,
Golden_Path}); both read the same, row by row.

Example: id (`webwalkerqa-<split>-<row>`, the row's position from 0: the files have no ids),
question, answers ([answer]), root_url, domain, lang, type (single/multi source), difficulty_level,
source_website and golden_path (sequences).
"""
from __future__ import annotations

import logging

import tensorflow_datasets as tfds

from matpo_jax.data import published

PUBLISHED_AT = "https://huggingface.co/datasets/callanwu/WebWalkerQA (data/*.jsonl)"
SPLIT_FILES = {"main": "main-00000-of-00001.jsonl", "silver": "silver-00000-of-00001.jsonl"}
# field -> (lower-case key, capitalised key); the INFO ones live inside `info` / `Info`
TOP_KEYS = {"question": ("question", "Question"), "answer": ("answer", "Answer"),
            "root_url": ("root_url", "Root_Url"), "info": ("info", "Info")}
INFO_KEYS = {
    "domain": ("domain", "Domain"),
    "lang": ("lang", "Language"),
    "type": ("type", "Hop"),
    "difficulty_level": ("difficulty_level", "Difficulty_Level"),
    "source_website": ("source_website", "Source_Website"),
    "golden_path": ("golden_path", "Golden_Path"),
}
LIST_FIELDS = ("source_website", "golden_path")


def _list(value, key: str, path, line: int) -> list[str]:
    """A list of strings; a lone string is a list of one."""
    if isinstance(value, str):
        return [value] if value.strip() else []
    return published.text_list(value, key, path, line)


def parse_row(row: dict, split: str, position: int, path, line: int) -> dict:
    schema = 1 if "Question" in row and "question" not in row else 0  # 1: capitalised keys
    top = {field: names[schema] for field, names in TOP_KEYS.items()}
    info = row.get(top["info"]) or {}
    if not isinstance(info, dict):
        raise published.row_error(path, line, f"field {top['info']!r} must be an object")
    example = {
        "id": f"webwalkerqa-{split}-{position:05d}",
        "question": published.text(row, top["question"], path, line),
        "answers": published.answer_list(published.text(row, top["answer"], path, line),
                                         path=path, line=line),
        "root_url": published.text(row, top["root_url"], path, line, required=False),
    }
    for field, names in INFO_KEYS.items():
        name = names[schema]
        if field in LIST_FIELDS:
            example[field] = _list(info.get(name), name, path, line)
        else:
            example[field] = published.text(info, name, path, line, required=False)
    return example


class Webwalkerqa(published.PublishedBuilder):
    """WebWalkerQA: questions answered by walking a website from its root URL."""

    name = "webwalkerqa"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    PUBLISHED_AT = PUBLISHED_AT
    HOMEPAGE = "https://huggingface.co/datasets/callanwu/WebWalkerQA"
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        f"Download {' and '.join(SPLIT_FILES.values())} from {PUBLISHED_AT} into the manual "
        "dir (or its data/ subdirectory).")

    def _info(self) -> tfds.core.DatasetInfo:
        text_sequence = lambda: tfds.features.Sequence(tfds.features.Text())  # noqa: E731
        return self._question_info(
            root_url=tfds.features.Text(),
            domain=tfds.features.Text(),
            lang=tfds.features.Text(),
            type=tfds.features.Text(),
            difficulty_level=tfds.features.Text(),
            source_website=text_sequence(),
            golden_path=text_sequence(),
        )

    def _split_generators(self, dl_manager):
        directory = self._manual_dir(dl_manager)
        paths = {"main": self._find(directory, SPLIT_FILES["main"], f"data/{SPLIT_FILES['main']}")}
        try:  # the 15k silver questions are training data: an evaluation can do without them
            paths["silver"] = self._find(directory, SPLIT_FILES["silver"],
                                         f"data/{SPLIT_FILES['silver']}")
        except published.DatasetFileError as missing:
            logging.warning("webwalkerqa: no silver split (%s)", missing)
        return {split: self._generate_examples(split, path) for split, path in paths.items()}

    def _generate_examples(self, split, path):
        for position, (line, row) in enumerate(published.read_jsonl(path)):
            yield line, parse_row(row, split, position, path, line)


def prepare_dataset(config=None, *, manual_dir=None, data_dir=None) -> Webwalkerqa:
    """Builds (once) from the files in `manual_dir` and returns the builder."""
    return published.prepare(Webwalkerqa, config, manual_dir=manual_dir, data_dir=data_dir)
