"""TFDS builder for the synthetic multi-hop questions (array_record; readable without TensorFlow).

    builder = prepare_dataset("default", data_dir)           # or tfds.builder(...) + download_and_prepare
    source = tfds.data_source("synthetic_multihop/default", data_dir=data_dir)["train"]
    corpus = corpus_path(builder)   # <data_dir>/synthetic_multihop/<config>/<version>/corpus.jsonl

Every record is a question of the world `build_world(**config)` makes: id, question, answer, hops
(int32) and chain (JSON list of hops: subject, relation, object, answer, doc_id). The corpus the
questions are researched in is written as JSONL next to the data files, for the search service.
Custom worlds: `make_config(seed=3, noise=0.7, ...)` and pass `config=` to the builder.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
from etils import epath
import tensorflow_datasets as tfds

from matpo_jax.data import synthetic_world

CORPUS_FILENAME = "corpus.jsonl"
FILE_FORMAT = "array_record"  # random access for grain; written by tfds without TensorFlow
WORLD_FIELDS = ("seed", "num_entities", "noise", "num_questions", "max_hops", "fact_style",
                "sft_fraction", "name_words")


@dataclasses.dataclass(eq=False)
class SyntheticMultihopConfig(tfds.core.BuilderConfig):
    """The build_world arguments of one dataset variant."""

    seed: int = 0
    num_entities: int = 300
    noise: float = 0.0
    num_questions: int = 4000
    max_hops: int = 4
    fact_style: str = "varied"
    sft_fraction: float = 0.0  # > 0: an `sft` split of its own entities (demonstrations)
    name_words: int = 0  # > 0: names built from a shared lexicon of that many words

    def world_kwargs(self) -> dict:
        return {field: getattr(self, field) for field in WORLD_FIELDS}


def make_config(name: str | None = None, **world_kwargs) -> SyntheticMultihopConfig:
    """A config for any world; the default name spells the arguments, so two different worlds
    never share a data directory."""
    values = {f.name: f.default for f in dataclasses.fields(SyntheticMultihopConfig)
              if f.name in WORLD_FIELDS}
    unknown = set(world_kwargs) - set(values)
    if unknown:
        raise ValueError(f"unknown synthetic_multihop config fields {sorted(unknown)}; "
                         f"known: {list(WORLD_FIELDS)}")
    values.update(world_kwargs)
    if name is None:
        name = ("s{seed}_e{num_entities}_n{noise:g}_q{num_questions}_h{max_hops}"
                .format(**values).replace(".", "p"))
        if values["fact_style"] != "varied":  # older worlds keep their names
            name += f"_{values['fact_style']}"
        if values["sft_fraction"]:
            name += f"_sft{values['sft_fraction']:g}".replace(".", "p")
        if values["name_words"]:
            name += f"_w{values['name_words']}"
    return SyntheticMultihopConfig(name=name, description=f"synthetic world {values}", **values)


class SyntheticMultihop(tfds.core.GeneratorBasedBuilder):
    """Multi-hop questions over a procedurally generated world (see synthetic_world.py)."""

    # Bump whenever the generator's output changes, so a cached world is never silently reused.
    VERSION = tfds.core.Version("1.5.0")
    RELEASE_NOTES = {"1.0.0": "First release.", "1.1.0": "Short page ids (d42); shorter texts.",
                     "1.2.0": "Page ids name their entity (page <name>).",
                     "1.3.0": "Plain facts as key-value lines without 'is' (X founder Y.).",
                     "1.4.0": "Optional sft split (sft_fraction); worlds without it unchanged.",
                     "1.5.0": "Optional shared name lexicon (name_words); worlds without it "
                              "unchanged."}
    BUILDER_CONFIGS = [
        make_config("default", noise=0.0),
        make_config("noisy", noise=0.5),
        make_config("very_noisy", noise=1.0),
        make_config("tiny", num_entities=60, num_questions=400, noise=0.3),  # tests, smoke runs
    ]
    DEFAULT_CONFIG_NAME = "default"

    # tfds 4.9.10 locates a builder's source through the `importlib_resources` backport, which it
    # does not declare as a dependency (tensorflow/datasets#11212); this file's path is all it needs.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        return epath.Path(__file__)

    def _create_builder_config(self, builder_config, version):
        # Every world make_config spells is a config of this builder, not a foreign one: tfds
        # logs "Using custom data configuration: <the whole config>" each time a builder is made
        # with a config outside BUILDER_CONFIGS, which a run does at every evaluation and tool
        # start. Such a world is taken as it is; names, the class's own configs and a config
        # reusing a class config's name keep tfds's checks (and its errors).
        if (isinstance(builder_config, SyntheticMultihopConfig)
                and self.get_builder_config(builder_config.name) is None):
            return builder_config
        return super()._create_builder_config(builder_config, version)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(),
                "question": tfds.features.Text(),
                "answer": tfds.features.Text(),
                "hops": np.int32,
                "chain": tfds.features.Text(),  # JSON list of synthetic_world.Hop
            }),
            supervised_keys=("question", "answer"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download: the world is generated
        world = synthetic_world.build_world(**self.builder_config.world_kwargs())
        # self.data_dir is the temporary directory tfds renames into place once all is written.
        world.write_corpus(os.path.join(self.data_dir, CORPUS_FILENAME))
        return {split: self._generate_examples(questions)
                for split, questions in world.questions.items()}

    def _generate_examples(self, questions):
        for question in questions:
            yield question.id, question.to_record()


def prepare_dataset(config: str | SyntheticMultihopConfig = "default",
                    data_dir: str | os.PathLike | None = None) -> SyntheticMultihop:
    """Builds the dataset (once; a prepared one is reused) and returns its builder."""
    builder = SyntheticMultihop(config=config, data_dir=data_dir, file_format=FILE_FORMAT)
    # Nothing is hosted anywhere: never ask GCS for a prebuilt copy (this machine is offline).
    offline = tfds.download.DownloadConfig(try_download_gcs=False)
    builder.download_and_prepare(file_format=FILE_FORMAT, download_config=offline)
    return builder


def corpus_path(builder: SyntheticMultihop) -> str:
    """Where the corpus JSONL of a prepared dataset lives (next to its array_record files)."""
    return os.path.join(builder.data_dir, CORPUS_FILENAME)
