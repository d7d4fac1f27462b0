"""What the builders of the published benchmarks share: finding their files in the TFDS manual dir,
reading JSONL / TSV rows with errors that name file and line, and the common example fields.

Every example of every benchmark has `id` (text), `question` (text) and `answers` (a sequence of
text, the first one canonical), plus its dataset's own metadata. Nothing is downloaded: the user
puts the files where the dataset publishes them into a directory D and prepares with

    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=D))   # or prepare(...) below
"""
from __future__ import annotations

import ast
import csv
import io
import json
import os
import sys
from typing import Any, Iterator, Sequence

from etils import epath
import tensorflow_datasets as tfds

from matpo_jax.rl.answer_normalization import is_empty_answer

FILE_FORMAT = "array_record"  # random access for grain; written by tfds without TensorFlow


class DatasetFileError(FileNotFoundError):
    """A file the builder needs is not in the manual dir (the message says where to get it)."""


class DatasetRowError(ValueError):
    """A row of a published file that cannot be read (the message names file and line)."""


def row_error(path, line: int, message: str) -> DatasetRowError:
    return DatasetRowError(f"{path}:{line}: {message}")


# ------------------------------------------------------------------------------- the manual dir

def manual_dir(dl_manager, dataset: str, published_at: str) -> epath.Path:
    """The builder's manual dir, or one line naming the path it should be and what goes in it."""
    try:
        return epath.Path(dl_manager.manual_dir)
    except AssertionError:  # tfds: a missing or empty directory, in a multi-line message
        path = getattr(dl_manager, "_manual_dir", None)
        raise DatasetFileError(
            f"{path}: manual dir of {dataset} is missing or empty; download {dataset} from "
            f"{published_at} and put its files there") from None


def find_file(directory: epath.Path, candidates: Sequence[str], dataset: str,
              published_at: str) -> epath.Path:
    """The first of `candidates` (paths relative to the manual dir) that exists."""
    for relative in candidates:
        path = directory / relative
        if path.exists():
            return path
    also = f" (or {', '.join(candidates[1:])})" if len(candidates) > 1 else ""
    raise DatasetFileError(f"{directory / candidates[0]}: not found{also}; {dataset} is "
                           f"published at {published_at}")


# ------------------------------------------------------------------------------- reading rows

def empty_file_error(path, what: str = "rows") -> DatasetRowError:
    return DatasetRowError(f"{path}: empty file (no {what})")


def _not_utf8(path, line: int, raw: bytes, error: UnicodeDecodeError, line_start: int = 0):
    column = error.start - line_start + 1
    return row_error(path, line, f"not UTF-8: byte 0x{raw[error.start]:02x} at column {column}")


def read_jsonl(path: epath.Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line; a file without any is an error."""
    found = False
    # Bytes, decoded line by line: an undecodable byte is named with its line.
    with epath.Path(path).open("rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise _not_utf8(path, line_no, raw, error) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise row_error(path, line_no, f"invalid JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise row_error(path, line_no, f"expected a JSON object, got "
                                               f"{type(record).__name__}")
            found = True
            yield line_no, record
    if not found:
        raise empty_file_error(path, "JSON rows")


def read_tsv(path: epath.Path) -> Iterator[tuple[int, list[str]]]:
    """(first line number of the row, fields) for every row, the header included (line 1).
    Quoted fields may hold tabs and newlines, as pandas writes them. An empty file is an error."""
    csv.field_size_limit(sys.maxsize)  # FRAMES' wiki_links cells are long
    # Read whole (the benchmark files are small): epath's open() takes no `newline` argument.
    data = epath.Path(path).read_bytes()
    try:
        text_ = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_start = data.rfind(b"\n", 0, error.start) + 1
        raise _not_utf8(path, data.count(b"\n", 0, error.start) + 1, data, error,
                        line_start) from None
    if not text_.strip():
        raise empty_file_error(path)
    reader = csv.reader(io.StringIO(text_, newline=""), delimiter="\t")
    start = 1
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise row_error(path, start, f"unreadable TSV row ({error})") from None
        if any(field.strip() for field in fields):
            yield start, fields
        start = reader.line_num + 1


# ------------------------------------------------------------------------------- field values

def text(record: dict, key: str, path, line: int, *, required: bool = True) -> str:
    """A string field; absent or null is "" unless required; numbers are written as text."""
    value = record.get(key)
    if value is None:
        if required:
            raise row_error(path, line, f"missing field {key!r}")
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise row_error(path, line, f"field {key!r} must be text, got {type(value).__name__}")
    return str(value)


def text_list(value: Any, key: str, path, line: int) -> list[str]:
    """A list of strings (None is the empty list)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise row_error(path, line, f"field {key!r} must be a list of strings")
    return list(value)


def python_list(cell: str, key: str, path, line: int) -> list[str]:
    """A list of strings written as a Python literal ("['a', 'b']"), read with ast.literal_eval:
    literals only, nothing is executed."""
    if not cell.strip():
        return []
    try:
        value = ast.literal_eval(cell.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise row_error(path, line, f"column {key!r} is not a Python list literal: "
                                    f"{cell[:80]!r}") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise row_error(path, line, f"column {key!r} must be a list of strings: {cell[:80]!r}")
    return [v.strip() for v in value]


def answer_list(canonical: str, aliases: Sequence[str] = (), *, path, line: int) -> list[str]:
    """The canonical answer first, then the distinct aliases that are not empty once normalised,
    in their order. A canonical answer empty once normalised ("", "The", ".") is refused, naming
    file and line: no prediction could match it, and an empty prediction would."""
    if is_empty_answer(canonical):
        raise row_error(path, line, f"answer {canonical!r} is empty once normalised (case, "
                                    "punctuation and articles dropped): no answer could match "
                                    "it; fix or remove the row")
    out = [canonical]
    for alias in aliases:
        if not is_empty_answer(alias) and alias not in out:
            out.append(alias)
    return out


# ------------------------------------------------------------------------------- builders

def question_features(**metadata) -> tfds.features.FeaturesDict:
    """The fields every benchmark example has, plus the dataset's own."""
    return tfds.features.FeaturesDict({
        "id": tfds.features.Text(),
        "question": tfds.features.Text(),
        "answers": tfds.features.Sequence(tfds.features.Text()),  # first: canonical
        **metadata,
    })


class PublishedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A builder over files the user downloaded (a dataset's `MANUAL_DOWNLOAD_INSTRUCTIONS` says
    which). Examples keep the files' order, so "the first N questions" is the same everywhere."""

    PUBLISHED_AT = ""  # where the files come from (named in every missing-file error)
    HOMEPAGE = ""

    # tfds 4.9.10 locates a builder's source through the `importlib_resources` backport, which it
    # does not declare as a dependency (tensorflow/datasets#11212); the module's path is enough.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        return epath.Path(sys.modules[cls.__module__].__file__)

    def _question_info(self, **metadata) -> tfds.core.DatasetInfo:
        """Info with the common fields plus `metadata` features, examples in file order."""
        return tfds.core.DatasetInfo(
            builder=self, description=sys.modules[type(self).__module__].__doc__,
            features=question_features(**metadata), homepage=self.HOMEPAGE,
            disable_shuffling=True)

    def _manual_dir(self, dl_manager) -> epath.Path:
        return manual_dir(dl_manager, self.name, self.PUBLISHED_AT)

    def _find(self, directory: epath.Path, *candidates: str) -> epath.Path:
        return find_file(directory, candidates, self.name, self.PUBLISHED_AT)


def prepare(builder_cls, config=None, *, manual_dir: str | os.PathLike | None = None,
            data_dir: str | os.PathLike | None = None):
    """Builds a published dataset from the files in `manual_dir` (once; a prepared one is
    reused) and returns its builder. Never downloads anything."""
    builder = builder_cls(config=config, data_dir=data_dir, file_format=FILE_FORMAT)
    download_config = tfds.download.DownloadConfig(
        manual_dir=None if manual_dir is None else os.fspath(manual_dir), try_download_gcs=False)
    builder.download_and_prepare(file_format=FILE_FORMAT, download_config=download_config)
    return builder
