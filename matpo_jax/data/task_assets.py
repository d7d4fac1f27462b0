"""What a training run needs of its task, whichever dataset it trains on:

    assets = prepare_task(cfg, data_dir)
    assets.source("train")      # a random-access source of data.name's split (grain-ready)
    assets.corpus_path          # what the local search service serves (None: no local corpus)
    assets.chat                 # ChatFormat over the run's tokenizer
    assets.world                # the synthetic world's assets (SFT demonstrations); else None

The synthetic world (data.name = synthetic_multihop) is built by world_assets.prepare_world, as
before. A published dataset (data.name = musique, ...) is prepared once from
`data.manual_dir/<name>/` into `data_dir`; its tokenizer and chat template are the checkpoint's
(`model.tokenizer`, else `model.hf_checkpoint`), and MuSiQue's corpus is its paragraph export.
"""
from __future__ import annotations

import dataclasses
import os

from matpo_jax.chat import ChatFormat
from matpo_jax.config import ConfigError
from matpo_jax.data import loader as loader_lib
from matpo_jax.data import musique, published
from matpo_jax.data import world_assets as world_assets_lib


@dataclasses.dataclass
class TaskAssets:
    name: str  # data.name
    config: object  # the dataset's builder config (the world's config for the synthetic world)
    data_dir: str
    corpus_path: str | None
    tokenizer_dir: str
    chat: ChatFormat
    world: world_assets_lib.WorldAssets | None = None  # the synthetic world only
    manual_dir: str | None = None

    def source(self, split: str):
        """The random-access source of one split of the run's dataset (prepared already)."""
        if self.name == loader_lib.SYNTHETIC:
            return loader_lib.open_source(self.config, self.data_dir)[split]
        sources = loader_lib.open_dataset(self.name, data_dir=self.data_dir, config=self.config,
                                          prepare=False)
        if split not in sources:
            raise ConfigError(f"data.split = {split!r}: {self.name} has the splits "
                              f"{', '.join(sorted(sources))}")
        return sources[split]


def prepare_task(cfg, data_dir: str) -> TaskAssets:
    """Builds (or reuses) the run's dataset, corpus and tokenizer (config.to_typed `cfg`)."""
    if cfg.data.name == loader_lib.SYNTHETIC:
        world = world_assets_lib.prepare_world(cfg, data_dir)
        return TaskAssets(name=loader_lib.SYNTHETIC, config=world.config, data_dir=data_dir,
                          corpus_path=world.corpus_path, tokenizer_dir=world.tokenizer_dir,
                          chat=world.chat, world=world)
    return _prepare_published(cfg, data_dir)


def _prepare_published(cfg, data_dir: str) -> TaskAssets:
    name = cfg.data.name
    if world_assets_lib.configured_tokenizer(cfg) is None:  # to_typed refuses this too
        raise ConfigError(f"model.hf_checkpoint: data.name = {name!r} needs a checkpoint's "
                          f"tokenizer (model.hf_checkpoint or model.tokenizer)")
    tokenizer_dir, chat = world_assets_lib.checkpoint_tokenizer(cfg)  # checked before any work
    config = loader_lib.PUBLISHED[name][1]
    own_manual_dir = os.path.join(cfg.data.manual_dir, name) if cfg.data.manual_dir else None
    try:
        with world_assets_lib.exclusive(data_dir):  # runs started together build it once
            builder = loader_lib.PUBLISHED[name][0].prepare_dataset(
                config, manual_dir=own_manual_dir, data_dir=data_dir)
    except published.DatasetFileError as error:
        if not cfg.data.manual_dir:
            raise ConfigError(f"data.manual_dir: not set, and {name} is not prepared in "
                              f"{data_dir}; set it to the folder that holds {name}/ (the files "
                              f"as published)") from None
        raise ConfigError(f"data.manual_dir: {error}") from None
    except published.DatasetRowError as error:
        raise ConfigError(f"data.manual_dir: {error}") from None
    corpus = musique.corpus_path(builder) if name == "musique" else None
    if corpus is None and cfg.tools.search_backend == "local":
        raise ConfigError(f"tools.search_backend = 'local': data.name = {name!r} has no corpus "
                          f"for the local search service; set tools.search_backend and "
                          f"tools.search_url to a search service")
    return TaskAssets(name=name, config=config, data_dir=data_dir, corpus_path=corpus,
                      tokenizer_dir=tokenizer_dir, chat=chat, manual_dir=cfg.data.manual_dir)
