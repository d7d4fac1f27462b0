"""Pure-data records of rollouts: what the rollout engine produces and the trainer consumes.

Token-in, token-out: `tokens` are exactly the ids in the model's context, in order; the ones with
`trainable[i] == True` were sampled by the policy, and `logprobs[i]` is the log-probability the
sampler gave them (0.0 on non-trainable tokens). Nothing here is ever rebuilt from decoded text.
"""
from __future__ import annotations

import dataclasses
from typing import Any

PLANNER = "planner"
WORKER = "worker"
SINGLE = "single"
ROLES = (PLANNER, WORKER, SINGLE)
ROLE_IDS = {PLANNER: 0, WORKER: 1, SINGLE: 0}  # the single agent trains like a planner row


@dataclasses.dataclass
class ToolCallRecord:
    """One tool call an agent made, parsed from its own sampled text."""

    turn: int
    name: str | None  # None when the call could not be parsed at all
    arguments: dict[str, Any] | None
    valid: bool  # parseable, known tool, arguments match the schema in this role's prompt
    error: str | None = None  # parse/schema error or tool failure text shown to the model
    tool_failed: bool = False  # the tool itself failed (HTTP error, timeout...): not a format error


@dataclasses.dataclass
class Rollout:
    """One agent's trajectory: a planner, a worker it spawned, or a single agent."""

    rollout_id: int
    role: str  # PLANNER | WORKER | SINGLE
    query_index: int  # which question of the RL batch (the GRPO group)
    sample_index: int  # which of the G samples of that question (for workers: the parent's)
    parent_id: int | None  # for workers: the planner rollout that spawned it
    tokens: list[int] = dataclasses.field(default_factory=list)
    trainable: list[bool] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    assistant_texts: list[str] = dataclasses.field(default_factory=list)  # decoded sampled turns
    tool_calls: list[ToolCallRecord] = dataclasses.field(default_factory=list)
    num_turns: int = 0
    finish_reason: str = ""  # answer | max_turns | max_context | max_new_tokens | ...
    child_ids: list[int] = dataclasses.field(default_factory=list)  # workers spawned (planner)
    report: str | None = None  # worker: the cleaned report handed to the planner
    # worker: the 0-based planner turn whose subagent call spawned it (the setwise ratio's set)
    spawn_turn: int | None = None

    def append(self, ids, *, trainable: bool, logprobs=None) -> None:
        ids = [int(t) for t in ids]
        self.tokens.extend(ids)
        self.trainable.extend([trainable] * len(ids))
        if logprobs is None:
            logprobs = [0.0] * len(ids)
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probs")
        self.logprobs.extend(float(x) for x in logprobs)

    @property
    def num_trainable(self) -> int:
        return sum(self.trainable)

    def format_score(self) -> float:
        """Fraction of this agent's tool calls that were valid (1.0 when it made none)."""
        if not self.tool_calls:
            return 1.0
        return sum(c.valid for c in self.tool_calls) / len(self.tool_calls)
