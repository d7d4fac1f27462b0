"""TFDS builder for GAIA (Mialon et al., 2023), validation questions from the published metadata.

    builder = prepare_dataset("text", manual_dir=D, data_dir=DATA)
    source = tfds.data_source("gaia/text", data_dir=DATA)["validation"]

The file (https://huggingface.co/datasets/gaia-benchmark/GAIA, gated): 2023/validation/
metadata.jsonl, rows {task_id, Question, Level, "Final answer", file_name, "Annotator Metadata"}.
Only the validation answers are public, so the one split is `validation`. Configs:
    text (default)  questions a text-only agent can attempt: those without an attached file, or,
                    when the manual dir holds text_task_ids.txt (one task id a line), exactly
                    those (how the usual 103-question text subset is selected)
    all             every validation question

Example: id (task_id), question, answers ([Final answer]), level (int, whether the file writes
1 or "1"), file_name ("" when none) and annotator_metadata (JSON text).
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
from etils import epath
import tensorflow_datasets as tfds

from matpo_jax.data import published

PUBLISHED_AT = "https://huggingface.co/datasets/gaia-benchmark/GAIA (gated; 2023/validation/)"
METADATA = "2023/validation/metadata.jsonl"
TEXT_TASK_IDS = "text_task_ids.txt"
LEVELS = (1, 2, 3)


@dataclasses.dataclass(eq=False)
class GaiaConfig(tfds.core.BuilderConfig):
    text_only: bool = True


def parse_level(value, path, line: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise published.row_error(path, line, f"Level {value!r} is not a number")
    try:
        number = float(str(value).strip())  # 2, "2", 2.0 and "2.0" are all level 2
    except ValueError:
        raise published.row_error(path, line, f"Level {value!r} is not a number") from None
    if number not in LEVELS:
        raise published.row_error(path, line, f"Level {value!r} is not one of {LEVELS}")
    return int(number)


def parse_row(row: dict, path, line: int) -> dict:
    metadata = row.get("Annotator Metadata") or {}
    return {
        "id": published.text(row, "task_id", path, line),
        "question": published.text(row, "Question", path, line),
        "answers": published.answer_list(published.text(row, "Final answer", path, line),
                                         path=path, line=line),
        "level": parse_level(row.get("Level"), path, line),
        "file_name": published.text(row, "file_name", path, line, required=False),
        "annotator_metadata": json.dumps(metadata, ensure_ascii=False),
    }


def read_task_ids(path: epath.Path) -> dict[str, int]:
    """task id -> its line in text_task_ids.txt (blank lines and # comments skipped)."""
    ids = {}
    with path.open("r", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            task_id = line.split("#", 1)[0].strip()
            if not task_id:
                continue
            if task_id in ids:
                raise published.row_error(path, line_no, f"task id {task_id!r} listed twice")
            ids[task_id] = line_no
    return ids


class Gaia(published.PublishedBuilder):
    """GAIA validation questions for general assistants, with their level."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    PUBLISHED_AT = PUBLISHED_AT
    HOMEPAGE = "https://huggingface.co/datasets/gaia-benchmark/GAIA"
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        f"Download {METADATA} from {PUBLISHED_AT} into the manual dir (same relative path); "
        f"optionally add {TEXT_TASK_IDS}, one task id per line, to choose the text subset.")
    BUILDER_CONFIGS = [
        GaiaConfig(name="text", text_only=True,
                   description=f"questions without an attached file, or those in {TEXT_TASK_IDS}"),
        GaiaConfig(name="all", text_only=False, description="every validation question"),
    ]
    DEFAULT_CONFIG_NAME = "text"

    def _info(self) -> tfds.core.DatasetInfo:
        return self._question_info(
            level=np.int32,
            file_name=tfds.features.Text(),
            annotator_metadata=tfds.features.Text(),  # JSON of "Annotator Metadata"
        )

    def _split_generators(self, dl_manager):
        directory = self._manual_dir(dl_manager)
        metadata = self._find(directory, METADATA)
        selected = None
        if self.builder_config.text_only and (directory / TEXT_TASK_IDS).exists():
            selected = read_task_ids(directory / TEXT_TASK_IDS)
        return {"validation": self._generate_examples(metadata, selected, directory)}

    def _generate_examples(self, path, selected, directory):
        found = set()
        for line, row in published.read_jsonl(path):
            example = parse_row(row, path, line)
            if selected is not None:
                keep = example["id"] in selected
            else:
                keep = not self.builder_config.text_only or not example["file_name"]
            if keep:
                found.add(example["id"])
                yield line, example
        if selected is not None:
            missing = [task_id for task_id in selected if task_id not in found]
            if missing:
                ids_path = directory / TEXT_TASK_IDS
                raise published.row_error(ids_path, selected[missing[0]],
                                          f"task id {missing[0]!r} is not in {path} "
                                          f"({len(missing)} listed ids missing)")


def prepare_dataset(config: str | GaiaConfig = "text", *, manual_dir=None,
                    data_dir=None) -> Gaia:
    """Builds (once) from the files in `manual_dir` and returns the builder."""
    return published.prepare(Gaia, config, manual_dir=manual_dir, data_dir=data_dir)
