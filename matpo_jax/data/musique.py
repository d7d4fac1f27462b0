"""TFDS builder for MuSiQue (Trivedi et al., 2022), from its published JSONL files.

    builder = prepare_dataset("ans", manual_dir=D, data_dir=DATA)   # D holds the .jsonl files
    source = tfds.data_source("musique/ans", data_dir=DATA)["train"]
    corpus = corpus_path(builder)   # every paragraph once, for the local search service

Files (https://github.com/StonyBrookNLP/musique, the data zip):
    musique_ans_v1.0_{train,dev}.jsonl    config `ans` (the default): answerable questions
    musique_full_v1.0_{train,dev}.jsonl   config `full`: each question with its unanswerable twin
Splits `train` and `validation` (the dev file). Unanswerable rows are left out unless the config
asks for them (`make_config("full", include_unanswerable=True)`); an unanswerable row shares its
twin's published id, so its `id` gets the suffix `__unanswerable`.

Example: id, question, answers (`answer` then `answer_aliases`), hops (from the id prefix:
2hop__, 3hop1__, 4hop2__ ...), answerable, paragraphs (title, text, is_supporting) and
decomposition (JSON text of `question_decomposition`).

The paragraph corpus (`corpus.jsonl` next to the array_record files, or `export_paragraph_corpus`)
holds every distinct paragraph of both files as {"id", "title", "contents"}, the format
`tools.search_server.load_corpus` reads: MuSiQue RL then runs offline, Search-R1 style.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np
from etils import epath
import tensorflow_datasets as tfds

from matpo_jax.data import published

PUBLISHED_AT = "https://github.com/StonyBrookNLP/musique (musique_v1.0.zip)"
CORPUS_FILENAME = "corpus.jsonl"
SPLIT_FILES = {"train": "train", "validation": "dev"}  # split -> file suffix
UNANSWERABLE_SUFFIX = "__unanswerable"
_HOPS = re.compile(r"^(\d+)hop\d*__")


@dataclasses.dataclass(eq=False)
class MusiqueConfig(tfds.core.BuilderConfig):
    variant: str = "ans"  # which files: musique_{variant}_v1.0_*.jsonl
    include_unanswerable: bool = False


def make_config(variant: str = "ans", include_unanswerable: bool = False) -> MusiqueConfig:
    if variant not in ("ans", "full"):
        raise ValueError(f"MuSiQue variant {variant!r}, expected 'ans' or 'full'")
    name = variant + ("_with_unanswerable" if include_unanswerable else "")
    return MusiqueConfig(name=name, variant=variant, include_unanswerable=include_unanswerable,
                         description=f"musique_{variant}_v1.0 files"
                                     + (", unanswerable rows kept" if include_unanswerable else ""))


def split_file(variant: str, split: str) -> str:
    return f"musique_{variant}_v1.0_{SPLIT_FILES[split]}.jsonl"


def hops_of(published_id: str, path, line: int) -> int:
    match = _HOPS.match(published_id)
    if match is None:
        raise published.row_error(path, line, f"id {published_id!r} does not start with a hop "
                                              f"count (2hop__, 3hop1__, ...)")
    return int(match.group(1))


def paragraphs_of(row: dict, path, line: int) -> list[dict]:
    """[{title, text, is_supporting}] in the file's order."""
    paragraphs = row.get("paragraphs")
    if not isinstance(paragraphs, list):
        raise published.row_error(path, line, "field 'paragraphs' must be a list")
    out = []
    for i, paragraph in enumerate(paragraphs):
        if not isinstance(paragraph, dict) or not isinstance(paragraph.get("paragraph_text"), str):
            raise published.row_error(path, line, f"paragraphs[{i}] needs a string "
                                                  f"'paragraph_text'")
        # Strict: bool("false") is True, so a string would mark the paragraph supporting.
        supporting = paragraph.get("is_supporting", False)
        if not isinstance(supporting, bool):
            raise published.row_error(path, line, f"paragraphs[{i}].is_supporting must be true "
                                                  f"or false, got {supporting!r}")
        out.append({"title": published.text(paragraph, "title", path, line, required=False),
                    "text": paragraph["paragraph_text"],
                    "is_supporting": supporting})
    return out


def parse_row(row: dict, path, line: int) -> dict:
    """One published row as an example (raises DatasetRowError naming file and line)."""
    published_id = published.text(row, "id", path, line)
    answerable = row.get("answerable", True)
    if not isinstance(answerable, bool):
        raise published.row_error(path, line, "field 'answerable' must be true or false")
    decomposition = row.get("question_decomposition", [])
    if not isinstance(decomposition, list):
        raise published.row_error(path, line, "field 'question_decomposition' must be a list")
    aliases = published.text_list(row.get("answer_aliases"), "answer_aliases", path, line)
    return {
        "id": published_id if answerable else published_id + UNANSWERABLE_SUFFIX,
        "question": published.text(row, "question", path, line),
        "answers": published.answer_list(published.text(row, "answer", path, line), aliases,
                                         path=path, line=line),
        "hops": hops_of(published_id, path, line),
        "answerable": answerable,
        "paragraphs": paragraphs_of(row, path, line),
        "decomposition": json.dumps(decomposition, ensure_ascii=False),
    }


class Musique(published.PublishedBuilder):
    """MuSiQue multi-hop questions with their 20 paragraphs each."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    PUBLISHED_AT = PUBLISHED_AT
    HOMEPAGE = "https://github.com/StonyBrookNLP/musique"
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        f"Download musique_v1.0.zip from {PUBLISHED_AT} and put musique_ans_v1.0_train.jsonl, "
        "musique_ans_v1.0_dev.jsonl (config ans) and/or musique_full_v1.0_{train,dev}.jsonl "
        "(config full) in the manual dir.")
    BUILDER_CONFIGS = [make_config("ans"), make_config("full")]
    DEFAULT_CONFIG_NAME = "ans"

    def _info(self) -> tfds.core.DatasetInfo:
        return self._question_info(
            hops=np.int32,
            answerable=np.bool_,
            paragraphs=tfds.features.Sequence({
                "title": tfds.features.Text(),
                "text": tfds.features.Text(),
                "is_supporting": np.bool_,
            }),
            decomposition=tfds.features.Text(),  # JSON of question_decomposition
        )

    def _split_generators(self, dl_manager):
        directory = self._manual_dir(dl_manager)
        variant = self.builder_config.variant
        paths = {split: self._find(directory, split_file(variant, split)) for split in SPLIT_FILES}
        # self.data_dir is the temporary directory tfds renames into place once all is written.
        write_paragraph_corpus(paths.values(), os.path.join(self.data_dir, CORPUS_FILENAME))
        return {split: self._generate_examples(path) for split, path in paths.items()}

    def _generate_examples(self, path):
        keep_unanswerable = self.builder_config.include_unanswerable
        for line, row in published.read_jsonl(path):
            example = parse_row(row, path, line)
            if example["answerable"] or keep_unanswerable:
                yield line, example  # the line number: twins share a published id


def prepare_dataset(config: str | MusiqueConfig = "ans", *, manual_dir=None,
                    data_dir=None) -> Musique:
    """Builds (once) from the files in `manual_dir` and returns the builder."""
    return published.prepare(Musique, config, manual_dir=manual_dir, data_dir=data_dir)


def corpus_path(builder: Musique) -> str:
    """The paragraph corpus JSONL of a prepared dataset (next to its array_record files)."""
    return os.path.join(builder.data_dir, CORPUS_FILENAME)


# ------------------------------------------------------------------------------ paragraph corpus

def write_paragraph_corpus(paths, out_path: str | os.PathLike) -> int:
    """Every distinct (title, text) paragraph of the files, once, as search-service JSONL; returns
    how many. Ids are the title, with " (2)", " (3)"... for further paragraphs of the same title
    (readable, and what `open` is called with); the order is the files' order."""
    seen: set[tuple[str, str]] = set()
    used_ids: set[str] = set()
    out_path = epath.Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.parent / (out_path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for path in paths:
            for line, row in published.read_jsonl(path):
                for paragraph in paragraphs_of(row, path, line):
                    key = (paragraph["title"], paragraph["text"])
                    if key in seen:
                        continue
                    seen.add(key)
                    title = paragraph["title"]
                    doc_id, count = title or "untitled", 1
                    while doc_id in used_ids:  # a title may itself end in " (2)"
                        count += 1
                        doc_id = f"{title or 'untitled'} ({count})"
                    used_ids.add(doc_id)
                    out.write(json.dumps({"id": doc_id, "title": title,
                                          "contents": paragraph["text"]},
                                         ensure_ascii=False) + "\n")
    tmp.rename(out_path)
    return len(seen)


def export_paragraph_corpus(manual_dir: str | os.PathLike, out_path: str | os.PathLike,
                            variant: str = "ans") -> int:
    """The corpus of one variant's train and dev files, without building the dataset."""
    directory = epath.Path(manual_dir)
    paths = [published.find_file(directory, [split_file(variant, split)], "musique", PUBLISHED_AT)
             for split in SPLIT_FILES]
    return write_paragraph_corpus(paths, out_path)
