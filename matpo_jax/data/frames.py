"""TFDS builder for FRAMES (Krishna et al., 2024), from its published `test.tsv`.

    builder = prepare_dataset(manual_dir=D, data_dir=DATA)   # D holds test.tsv
    source = tfds.data_source("frames", data_dir=DATA)["test"]

The file (https://huggingface.co/datasets/google/frames-benchmark) is tab-separated, with or
without a leading unnamed index column (pandas writes one). Columns read: Prompt, Answer,
wikipedia_link_1 ... wikipedia_link_11+, reasoning_types ("Numerical reasoning | Tabular
reasoning", split on `|`) and wiki_links (a Python list literal, read with ast.literal_eval).

Example: id (`frames-<index>`: the index column, or the row's position from 0), question,
answers ([Answer]), reasoning_types, wiki_links, wikipedia_links (the non-empty
wikipedia_link_* cells, in column order). One split: `test`.
"""
from __future__ import annotations

import tensorflow_datasets as tfds

from matpo_jax.data import published

PUBLISHED_AT = "https://huggingface.co/datasets/google/frames-benchmark (test.tsv)"
FILENAME = "test.tsv"
REQUIRED_COLUMNS = ("Prompt", "Answer", "reasoning_types", "wiki_links")
LINK_PREFIX = "wikipedia_link_"


def reasoning_types(cell: str) -> list[str]:
    return [part.strip() for part in cell.split("|") if part.strip()]


class Columns:
    """Where each column is in a header row, and whether an index column comes first."""

    def __init__(self, header: list[str], path):
        self.has_index = header[0].strip() in ("", "Unnamed: 0")
        self.width = len(header)
        names = [name.strip() for name in header]
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise published.row_error(path, 1, f"missing column(s) {missing} in the header "
                                               f"(found {names})")
        self.index = {name: i for i, name in enumerate(names)}
        self.links = [i for i, name in enumerate(names) if name.startswith(LINK_PREFIX)]


def parse_row(fields: list[str], columns: Columns, position: int, path, line: int) -> dict:
    if len(fields) != columns.width:
        raise published.row_error(path, line, f"expected {columns.width} tab-separated fields "
                                              f"like the header, got {len(fields)}")
    cell = lambda name: fields[columns.index[name]]  # noqa: E731
    if columns.has_index:
        index = fields[0].strip()
        if not index.isdigit():
            raise published.row_error(path, line, f"index column holds {index!r}, not a number")
    else:
        index = str(position)
    question, answer = cell("Prompt").strip(), cell("Answer").strip()
    if not question or not answer:
        raise published.row_error(path, line, "empty Prompt or Answer")
    return {
        "id": f"frames-{index}",
        "question": question,
        "answers": published.answer_list(answer, path=path, line=line),
        "reasoning_types": reasoning_types(cell("reasoning_types")),
        "wiki_links": published.python_list(cell("wiki_links"), "wiki_links", path, line),
        "wikipedia_links": [fields[i].strip() for i in columns.links
                            if fields[i].strip() and fields[i].strip().lower() != "nan"],
    }


class Frames(published.PublishedBuilder):
    """FRAMES: 824 multi-hop questions over Wikipedia, with their reasoning types."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    PUBLISHED_AT = PUBLISHED_AT
    HOMEPAGE = "https://huggingface.co/datasets/google/frames-benchmark"
    MANUAL_DOWNLOAD_INSTRUCTIONS = f"Download {FILENAME} from {PUBLISHED_AT} into the manual dir."

    def _info(self) -> tfds.core.DatasetInfo:
        return self._question_info(
            reasoning_types=tfds.features.Sequence(tfds.features.Text()),
            wiki_links=tfds.features.Sequence(tfds.features.Text()),
            wikipedia_links=tfds.features.Sequence(tfds.features.Text()),
        )

    def _split_generators(self, dl_manager):
        path = self._find(self._manual_dir(dl_manager), FILENAME)
        return {"test": self._generate_examples(path)}

    def _generate_examples(self, path):
        rows = published.read_tsv(path)
        header = next(rows, None)
        if header is None:
            raise published.row_error(path, 1, "empty file (no header row)")
        columns = Columns(header[1], path)
        position = -1
        for position, (line, fields) in enumerate(rows):
            yield line, parse_row(fields, columns, position, path, line)
        if position < 0:  # tfds would stop on the empty split naming no file
            raise published.empty_file_error(path, "rows after the header")


def prepare_dataset(config=None, *, manual_dir=None, data_dir=None) -> Frames:
    """Builds (once) from `test.tsv` in `manual_dir` and returns the builder."""
    return published.prepare(Frames, config, manual_dir=manual_dir, data_dir=data_dir)
