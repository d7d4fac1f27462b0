"""Question batches for training and evaluation: grain over a TFDS `data_source` (no TensorFlow).

    loader = make_loader("train", batch_size=8, seed=0, data_dir=DIR)
    source = question_source("musique", "train", data_dir=DIR, manual_dir=M)  # M/musique/*.jsonl
    loader = make_loader("train", batch_size=8, seed=0, source=source)
    it = iter(loader)
    batch = next(it)            # {"id": [...], "question": [...], "answer": [...], ...}
    state = it.get_state()      # bytes; store it with the checkpoint
    it.set_state(state)         # a restored iterator yields exactly the batches that followed

The order is a pure function of (seed, epoch, position), so restoring a state reproduces the
stream exactly. Records are decoded in the loader (text to str, sequences to lists, numbers to
int/bool), so batches are plain python values. Every dataset's records have `id` and `question`;
the accepted answers are `answers_of(record)` (the published benchmarks' `answers` list, the
synthetic world's one `answer`).
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Sequence

import grain.python as grain
import numpy as np
import tensorflow_datasets as tfds

from matpo_jax.data import frames, gaia, musique, synthetic_multihop, webwalkerqa

TEXT_FIELDS = ("id", "question", "answer", "chain")
SYNTHETIC = "synthetic_multihop"
# name -> (module with prepare_dataset, default config, the split a benchmark evaluates on)
PUBLISHED = {
    "musique": (musique, "ans", "validation"),
    "frames": (frames, None, "test"),
    "webwalkerqa": (webwalkerqa, None, "main"),
    "gaia": (gaia, "text", "validation"),
}
DATASET_NAMES = (SYNTHETIC, *PUBLISHED)


def _plain(value: Any) -> Any:
    """tfds values as python: bytes -> str, arrays and lists -> lists, numpy scalars -> python."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def decode_record(record: dict[str, Any]) -> dict[str, Any]:
    """A raw data_source record as python values (Text as str, hops as int)."""
    out = _plain(record)
    if "hops" in out:
        out["hops"] = int(out["hops"])
    return out


def answers_of(record: dict[str, Any]) -> list[str]:
    """The accepted answers of a decoded record of any dataset, the canonical one first."""
    return list(record["answers"]) if "answers" in record else [record["answer"]]


def golds_of(batch: dict[str, list]) -> list:
    """The accepted answers of each question of a collated batch, as the rewards take them: the
    synthetic world's one answer (text), a benchmark's list of aliases."""
    return batch["answers"] if "answers" in batch else batch["answer"]


class _DecodeRecord(grain.MapTransform):
    """tfds Text features arrive as bytes: decode once here, not in every consumer."""

    def map(self, record: dict[str, Any]) -> dict[str, Any]:
        return decode_record(record)


def collate(records: Sequence[dict[str, Any]]) -> dict[str, list]:
    """A batch as a dict of python lists (text stays text; the rollout tokenises it)."""
    return {key: [record[key] for record in records] for key in records[0]}


def open_source(config: str | synthetic_multihop.SyntheticMultihopConfig = "default",
                data_dir: str | os.PathLike | None = None, prepare: bool = True):
    """The split -> random-access source mapping of a synthetic_multihop variant."""
    if prepare:
        synthetic_multihop.prepare_dataset(config, data_dir)
    name = config if isinstance(config, str) else config.name
    return tfds.data_source(f"synthetic_multihop/{name}", data_dir=data_dir, download=False)


def open_dataset(name: str, *, data_dir: str | os.PathLike | None = None,
                 manual_dir: str | os.PathLike | None = None, config=None, prepare: bool = True):
    """The split -> random-access source mapping of any dataset by its `data.name`.

    Published benchmarks are built (once) from `<manual_dir>/<name>/`, the files as the dataset
    publishes them; a prepared one is reused without its files. config: a builder config or its
    name (default: musique `ans`, gaia `text`; for synthetic_multihop the world's config).
    """
    if name == SYNTHETIC:
        return open_source(config if config is not None else "default", data_dir, prepare)
    if name not in PUBLISHED:
        raise ValueError(f"dataset {name!r} has no builder; known: {', '.join(DATASET_NAMES)}")
    module, default_config, _ = PUBLISHED[name]
    config = default_config if config is None else config
    if prepare:
        own_dir = None if manual_dir is None else os.path.join(manual_dir, name)
        module.prepare_dataset(config, manual_dir=own_dir, data_dir=data_dir)
    config_name = config if config is None or isinstance(config, str) else config.name
    full_name = name if config_name is None else f"{name}/{config_name}"
    return tfds.data_source(full_name, data_dir=data_dir, download=False)


def question_source(name: str, split: str | None = None, **kwargs):
    """One split of `open_dataset(name, **kwargs)`; None: the split a benchmark evaluates on."""
    sources = open_dataset(name, **kwargs)
    split = split or (PUBLISHED[name][2] if name in PUBLISHED else "validation")
    if split not in sources:
        raise ValueError(f"dataset {name!r} has no split {split!r}; it has {sorted(sources)}")
    return sources[split]


class SubsetSource:
    """Records `indices` of a random-access source, as a random-access source of their own."""

    def __init__(self, source, indices):
        self._source, self._indices = source, [int(i) for i in indices]

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: int):
        return self._source[self._indices[index]]

    def __repr__(self) -> str:
        # Grain checks a restored iterator against repr(source): it must name the same records
        # in every process, so no object ids.
        digest = hashlib.sha1(np.asarray(self._indices, np.int64).tobytes()).hexdigest()[:16]
        return f"SubsetSource({self._source!r}, {len(self._indices)} records, indices {digest})"


def make_loader(
    split: str,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    num_epochs: int | None = None,
    data_dir: str | os.PathLike | None = None,
    config: str | synthetic_multihop.SyntheticMultihopConfig = "default",
    drop_remainder: bool = True,
    shard_options: grain.ShardOptions | None = None,
    worker_count: int = 0,
    source=None,
) -> grain.DataLoader:
    """A grain DataLoader over one split; `iter()` it for a checkpointable iterator.

    num_epochs=None repeats forever (training); pass 1 with shuffle=False for evaluation.
    worker_count=0 reads in the calling process: grain's worker processes need absl flags parsed.
    shard_options: e.g. grain.ShardByJaxProcess() on a multi-host pod (each host reads its share).
    source: any random-access source of records (default: the TFDS data_source of `config`).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if source is None:
        source = open_source(config, data_dir)[split]
    sampler = grain.IndexSampler(
        num_records=len(source),
        shard_options=shard_options or grain.NoSharding(),
        shuffle=shuffle,
        num_epochs=num_epochs,
        seed=seed,
    )
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[_DecodeRecord(),
                    grain.Batch(batch_size, drop_remainder=drop_remainder, batch_fn=collate)],
        worker_count=worker_count,
    )
