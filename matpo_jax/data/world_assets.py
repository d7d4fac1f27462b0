"""Everything the embedded default needs on disk, built once per world and reused.

    assets = prepare_world(cfg, data_dir)   # TFDS dataset + corpus JSONL + tokenizer
    assets.chat                                  # ChatFormat over the world's own tokenizer

The world, its tokenizer and its dataset are pure functions of the world config, so they live in a
directory named after that config and are shared by every run (SFT, MATPO, single-agent, seeds).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os

from matpo_jax.agents import prompts
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA, SUBAGENT_SCHEMA
from matpo_jax.config import ConfigError
from matpo_jax.data import synthetic_multihop, synthetic_world
from matpo_jax.data.oracle import LocalCorpusTools, Oracle
from matpo_jax.chat import ChatFormat
from matpo_jax.chat.tokenizer_training import train_tokenizer

TOKENIZER_DIRNAME = "tokenizer"
# Demonstrations whose text the tokenizer is trained on (besides the corpus): enough to learn the
# prompts, tool-call JSON and report phrasing as whole tokens.
TOKENIZER_DEMOS = 300


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
        seed=int(data.world_seed), num_entities=int(data.num_entities), noise=float(data.noise),
        num_questions=int(data.num_questions), max_hops=int(data.max_hops),
        fact_style=str(data.fact_style), sft_fraction=float(data.sft_fraction),
        name_words=int(data.name_words))


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
    oracle = Oracle(tools.search, tools.open, fact_style=builder.builder_config.fact_style)
    for question in world.questions["train"][:TOKENIZER_DEMOS]:
        for demo in (oracle.planner(question), oracle.single(question)):
            texts += [m["content"] for m in demo.messages]
            for worker in demo.workers:
                texts += [m["content"] for m in worker.messages]
    for role_text in prompts.ROLE_TEXT.values():
        texts.append(ChatFormat.system_prompt(role_text, [SEARCH_SCHEMA, OPEN_SCHEMA, SUBAGENT_SCHEMA]))
    return texts


@contextlib.contextmanager
def _exclusive(data_dir: str):
    """One builder at a time per data_dir: runs started together (seeds of a grid) share one world
    instead of racing to write it. Remote storage (gs://...) is not locked."""
    if "://" in str(data_dir):
        yield
        return
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, ".prepare.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prepare_world(cfg, data_dir: str) -> WorldAssets:
    """Builds (or reuses) the dataset, corpus and tokenizer of the configured world."""
    _check_dataset_names(cfg)
    with _exclusive(data_dir):
        return _prepare_world(cfg, data_dir)


def _check_dataset_names(cfg) -> None:
    """The config schema lists the paper's datasets, but only the synthetic world has a builder
    yet: fail before any work rather than train or evaluate on the wrong data."""
    problems = [f"{field} = {name!r}: only 'synthetic_multihop' has a dataset builder in this "
                f"release (the {name} builder, from files in data.manual_dir, is not written yet)"
                for field, names in (("data.name", [cfg.data.name]),
                                     ("eval.datasets", list(cfg.eval.datasets)))
                for name in names if name != "synthetic_multihop"]
    if problems:
        raise ConfigError(problems)


def _prepare_world(cfg, data_dir: str) -> WorldAssets:
    config = world_config(cfg)
    vocab_size = int(cfg.model.arch.vocab_size)
    builder = synthetic_multihop.prepare_dataset(config, data_dir)
    corpus = synthetic_multihop.corpus_path(builder)
    tokenizer_dir = os.path.join(builder.data_dir, f"{TOKENIZER_DIRNAME}_v{vocab_size}")
    if not os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
        tmp = tokenizer_dir + ".tmp"
        train_tokenizer(_tokenizer_texts(builder, corpus), vocab_size, tmp)
        os.replace(tmp, tokenizer_dir)  # atomic: a crash never leaves a half-written tokenizer
    return WorldAssets(config=config, data_dir=data_dir, builder=builder, corpus_path=corpus,
                       tokenizer_dir=tokenizer_dir, chat=ChatFormat.from_pretrained(tokenizer_dir))
