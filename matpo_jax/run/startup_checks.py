"""What validation cannot check from the config alone, checked as the run starts and before
config.json records it: the longest first prompt against rollout.max_context (it needs the task's
tokenizer and questions) and the packed batches against this host's memory. A run refused here
leaves no config.json, so rerunning it with the fix starts afresh instead of being refused as a
changed resume.
"""
from __future__ import annotations

import os

from matpo_jax.agents import prompts
from matpo_jax.agents.trajectory import PLANNER, SINGLE, WORKER
from matpo_jax.config import ConfigError, ExperimentConfig
from matpo_jax.data import loader as loader_lib
from matpo_jax.trainer.packing import PackedBatch, round_up

# Host bytes of one token of a PackedBatch: its int32 / float32 arrays (ref_logprobs included).
PACKED_BYTES_PER_TOKEN = 4 * len([f for f in PackedBatch.__dataclass_fields__])


def first_prompt_length(chat, role: str, user_message: str) -> int:
    """Tokens of a rollout's first prompt: the role's system turn, the user turn, the generation
    header, as the rollout engine writes it (agents/rollout.py `_open`)."""
    return len(chat.prompt_ids([{"role": "system", "content": prompts.system_prompt(role)},
                                {"role": "user", "content": user_message}]))


def _checked_splits(cfg: ExperimentConfig) -> list[str]:
    splits = [cfg.data.split]
    if cfg.data.name == loader_lib.SYNTHETIC and cfg.eval.split not in splits:
        splits.append(cfg.eval.split)  # the synthetic world's evaluation runs the same engine
    return splits


def check_prompts_fit(cfg: ExperimentConfig, assets) -> int:
    """Refuses (ConfigError naming rollout.max_context and the prompt's tokens) a context that
    cannot hold the longest first prompt of the run's questions and one assistant turn: such a
    rollout ends before its first token. Workers are checked with the shortest prompt a worker
    can get (an empty sub-task). Returns the longest first prompt's length."""
    ro = cfg.rollout
    top_role = PLANNER if ro.mode == "matpo" else SINGLE
    chat = assets.chat.with_thinking(cfg.chat.enable_thinking)  # the prompts the run writes
    longest, where = 0, ""
    for split in _checked_splits(cfg):
        source = assets.source(split)
        questions = [loader_lib.decode_record(source[i])["question"] for i in range(len(source))]
        if not questions:
            continue
        # Tokens follow characters closely: the 64 longest texts hold the longest prompt (save
        # for a tokenizer far from a steady few characters a token), at a fraction of the cost.
        candidates = sorted(range(len(questions)), key=lambda i: -len(questions[i]))[:64]
        for i in candidates:
            n = first_prompt_length(chat, top_role, prompts.question_prompt(questions[i]))
            if n > longest:
                longest, where = n, f"the {top_role} prompt of {split} question {i}"
        if ro.mode == "matpo":
            recap = (prompts.worker_recap(questions[candidates[0]], "") if ro.user_query_recap
                     else "")
            # A worker keeps room for its final summary: the instruction and the turn.
            reserve = (len(chat.user_turn_ids(prompts.FINAL_SUMMARY_INSTRUCTION,
                                              closed=False)) + ro.summary_tokens
                       if ro.final_summary else 0)
            n = first_prompt_length(chat, WORKER, recap) + reserve
            if n > longest:
                longest, where = n, (f"a worker's prompt for {split} question {candidates[0]}"
                                     + (f", plus the {reserve} kept for its final summary"
                                        if reserve else ""))
    needed = longest + ro.max_new_tokens_per_turn
    if needed > ro.max_context:
        raise ConfigError(
            f"rollout.max_context = {ro.max_context}: the longest first prompt needs {longest} "
            f"tokens ({where}) and a turn takes rollout.max_new_tokens_per_turn = "
            f"{ro.max_new_tokens_per_turn}: raise rollout.max_context to at least {needed}")
    return longest


def host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX host
        return None


def check_batches_fit_host(cfg: ExperimentConfig, data_shards: int = 1,
                           host_bytes: int | None = None) -> None:
    """Refuses packed batches (RL: rl.pack_rows rounded up to micro x mini x data shards, SFT:
    sft.batch_size rows; x rl.pack_len tokens) that this host cannot hold even once, naming the
    fields, instead of numpy's "Unable to allocate" after SFT."""
    host_bytes = host_bytes or host_memory_bytes()
    if not host_bytes:
        return
    rl = cfg.rl
    rows = round_up(rl.pack_rows, rl.micro_batches * rl.ppo_mini_batches * data_shards)
    for fields, batch_rows in ((f"rl.pack_rows = {rl.pack_rows} x rl.pack_len = {rl.pack_len}",
                                rows),
                               (f"sft.batch_size = {cfg.sft.batch_size} x rl.pack_len = "
                                f"{rl.pack_len}", cfg.sft.batch_size)):
        need = batch_rows * rl.pack_len * PACKED_BYTES_PER_TOKEN
        if need > host_bytes:
            raise ConfigError(
                f"{fields}: one packed batch of {batch_rows} rows needs {need / 2**30:.1f} GiB "
                f"of host memory, more than this host's {host_bytes / 2**30:.1f} GiB")
