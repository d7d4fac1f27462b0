"""Question batches for training and evaluation: grain over a TFDS `data_source` (no TensorFlow).

    loader = make_loader("train", batch_size=8, seed=0, data_dir=DIR)
    it = iter(loader)
    batch = next(it)            # {"id": [...], "question": [...], "answer": [...], "hops": [...], "chain": [...]}
    state = it.get_state()      # bytes; store it with the checkpoint
    it.set_state(state)         # a restored iterator yields exactly the batches that followed

The order is a pure function of (seed, epoch, position), so restoring a state reproduces the
stream exactly. Records are decoded to str in the loader, so batches are plain python values.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Sequence

import grain.python as grain
import numpy as np
import tensorflow_datasets as tfds

from matpo_jax.data import synthetic_multihop

TEXT_FIELDS = ("id", "question", "answer", "chain")


def decode_record(record: dict[str, Any]) -> dict[str, Any]:
    """A raw data_source record with its tfds Text (bytes) fields as str and hops as int."""
    out = {k: (v.decode("utf-8") if isinstance(v, bytes) else v) for k, v in record.items()}
    out["hops"] = int(out["hops"])
    return out


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
