"""Everything the embedded default needs on disk, built once per world and reused.

    assets = prepare_world(cfg, data_dir)   # TFDS dataset + corpus JSONL + tokenizer
    assets.chat                                  # ChatFormat over the run's tokenizer

The tokenizer (with its special tokens and chat template) is the checkpoint's when the config names
one (`model.tokenizer`, else `model.hf_checkpoint`); otherwise a small BPE tokenizer is trained on
the world's text. The world, its trained tokenizer and its dataset are pure functions of the world
config, so they live in a directory named after that config and are shared by every run (SFT,
MATPO, single-agent, seeds).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import json
import os

from matpo_jax.agents import prompts
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA, SUBAGENT_SCHEMA
from matpo_jax.config import ConfigError
from matpo_jax.data import synthetic_multihop, synthetic_world
from matpo_jax.data.oracle import LocalCorpusTools, Oracle
from matpo_jax.chat import ChatFormat, ChatFormatError
from matpo_jax.chat.tokenizer_training import PRE_TOKENIZER_VERSION, train_tokenizer
from matpo_jax.model.hf_io import CheckpointFormatError, load_config

TOKENIZER_DIRNAME = "tokenizer"
# Demonstrations whose text the tokenizer is trained on (besides the corpus): enough to learn the
# prompts, tool-call JSON and report phrasing as whole tokens.
TOKENIZER_DEMOS = 300


log = logging.getLogger(__name__)

@dataclasses.dataclass
class WorldAssets:
    config: synthetic_multihop.SyntheticMultihopConfig
    data_dir: str
    builder: synthetic_multihop.SyntheticMultihop
    corpus_path: str
    tokenizer_dir: str
    chat: ChatFormat


def world_config(cfg) -> synthetic_multihop.SyntheticMultihopConfig:
    data = cfg.data
    return synthetic_multihop.make_config(
        seed=data.world_seed, num_entities=data.num_entities, noise=data.noise,
        num_questions=data.num_questions, max_hops=data.max_hops,
        fact_style=data.fact_style, sft_fraction=data.sft_fraction,
        name_words=data.name_words)


def question_from_record(record: dict) -> synthetic_world.Question:
    """A loader record (id, question, answer, chain JSON) back as a Question with its hops."""
    return synthetic_world.Question(
        id=record["id"], split=record.get("split", ""), question=record["question"],
        answer=record["answer"], hops=synthetic_world.hops_from_json(record["chain"]))


def _tokenizer_texts(builder, corpus_path: str) -> list[str]:
    """Corpus pages plus rendered oracle conversations of every role (train split only)."""
    with open(corpus_path, encoding="utf-8") as f:
        pages = [json.loads(line) for line in f]
    # Each page's text, and its id as search listings quote it (the quoted spelling of a name is
    # other tokens than the spelling after a space; both should be whole words).
    texts = [page["contents"] for page in pages] + [f'(id: "{page["id"]}")' for page in pages]
    world = synthetic_world.build_world(**builder.builder_config.world_kwargs())
    tools = LocalCorpusTools(world.documents)
    # The single agent's fact lines are the workers' lines again; leaving them out keeps the
    # texts, and so the trained tokenizer, what they were before the single agent stated them.
    oracle = Oracle(tools.search, tools.open, fact_style=builder.builder_config.fact_style,
                    single_states_facts=False)
    for question in world.questions["train"][:TOKENIZER_DEMOS]:
        for demo in (oracle.planner(question), oracle.single(question)):
            texts += [m["content"] for m in demo.messages]
            for worker in demo.workers:
                texts += [m["content"] for m in worker.messages]
    for role_text in prompts.ROLE_TEXT.values():
        texts.append(ChatFormat.system_prompt(role_text, [SEARCH_SCHEMA, OPEN_SCHEMA, SUBAGENT_SCHEMA]))
    return texts


@contextlib.contextmanager
def exclusive(data_dir: str):
    """One builder at a time per data_dir: runs started together (seeds of a grid) share one world
    instead of racing to write it. Remote storage (gs://...) is not locked."""
    if "://" in str(data_dir):
        yield
        return
    os.makedirs(data_dir, exist_ok=True)
    try:
        lock = open(os.path.join(data_dir, ".prepare.lock"), "w")
    except OSError as error:  # a read-only data dir: usable when complete (nothing is written)
        log.warning("data dir %s: no lock file (%s); using it read-only", data_dir,
                    error.strerror or error)
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prepare_world(cfg, data_dir: str) -> WorldAssets:
    """Builds (or reuses) the dataset, corpus and tokenizer of the configured world."""
    with exclusive(data_dir):
        return _prepare_world(cfg, data_dir)


def _prepare_world(cfg, data_dir: str) -> WorldAssets:
    config = world_config(cfg)
    configured = checkpoint_tokenizer(cfg) if configured_tokenizer(cfg) else None
    builder = synthetic_multihop.prepare_dataset(config, data_dir)
    corpus = synthetic_multihop.corpus_path(builder)
    if configured:  # checked before any work
        tokenizer_dir, chat = configured
    else:
        tokenizer_dir = _trained_tokenizer_dir(builder, cfg)
        if not os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
            tmp = tokenizer_dir + ".tmp"
            train_tokenizer(_tokenizer_texts(builder, corpus), cfg.model.arch.vocab_size, tmp)
            os.replace(tmp, tokenizer_dir)  # atomic: a crash never leaves a half-written tokenizer
        chat = ChatFormat.from_pretrained(tokenizer_dir)
    return WorldAssets(config=config, data_dir=data_dir, builder=builder, corpus_path=corpus,
                       tokenizer_dir=tokenizer_dir, chat=chat)


# ----------------------------------------------------------------------------- tokenizer choice
def configured_tokenizer(cfg) -> tuple[str, str] | None:
    """(field, directory) of the Hugging Face tokenizer the config names: `model.tokenizer`, else
    the checkpoint's own (`model.hf_checkpoint`); None when the world's tokenizer is trained."""
    for field in ("tokenizer", "hf_checkpoint"):
        value = getattr(cfg.model, field, None)
        if value:
            return f"model.{field}", str(value)
    return None


def tokenizer_dir(cfg, data_dir: str) -> str:
    """Where a run's tokenizer lives (without building anything): the configured directory, or
    the world's trained tokenizer under `data_dir`."""
    configured = configured_tokenizer(cfg)
    if configured:
        return configured[1]
    builder = synthetic_multihop.SyntheticMultihop(config=world_config(cfg), data_dir=data_dir,
                                                   file_format=synthetic_multihop.FILE_FORMAT)
    return _trained_tokenizer_dir(builder, cfg)


def _trained_tokenizer_dir(builder, cfg) -> str:
    return os.path.join(builder.data_dir, f"{TOKENIZER_DIRNAME}_v{cfg.model.arch.vocab_size}"
                                          f"_pre{PRE_TOKENIZER_VERSION}")


def checkpoint_tokenizer(cfg) -> tuple[str, ChatFormat]:
    """The configured tokenizer, checked against the model's vocabulary (one line on error)."""
    field, path = configured_tokenizer(cfg)
    try:
        chat = ChatFormat.from_pretrained(path)
    except ChatFormatError as err:
        raise ConfigError(f"{field} = {path!r}: {err}") from None
    if cfg.model.hf_checkpoint:
        try:
            rows, rows_field = load_config(cfg.model.hf_checkpoint).vocab_size, \
                f"vocab_size in {os.path.join(cfg.model.hf_checkpoint, 'config.json')}"
        except CheckpointFormatError as err:
            raise ConfigError(f"model.hf_checkpoint: {err}") from None
    else:
        rows, rows_field = cfg.model.arch.vocab_size, "model.arch.vocab_size"
    if chat.id_count > rows:
        raise ConfigError(f"{rows_field} = {rows}: the tokenizer in {path} ({field}) uses ids up to "
                          f"{chat.id_count - 1}; the model needs at least {chat.id_count} rows")
    return path, chat
