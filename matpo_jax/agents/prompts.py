"""Role prompts and the texts that glue planner and worker contexts together.

Deliberately short: a tiny model is trained on them on a CPU, and every prompt token is context that
a search result cannot use. The tool schemas are added to the system text by
`ChatFormat.system_prompt(role_text, tools)`; these texts only describe the role.
"""
from __future__ import annotations

import re

from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA, SUBAGENT_SCHEMA
from matpo_jax.agents.trajectory import PLANNER, SINGLE, WORKER
from matpo_jax.chat import ChatFormat, strip_think
from matpo_jax.chat.tokenizer_training import CONTROL_TOKENS

PLANNER_ROLE = (
    "You are a planner. Give each simple sub-task to a worker with the subagent tool, one call per "
    "turn, then answer from their reports."
)
WORKER_ROLE = (
    "You are a worker. Solve your sub-task with the search and open tools, one call per turn."
)
SINGLE_ROLE = (
    "You are a researcher. Find the facts with the search and open tools, one call per turn, "
    "then answer."
)
ROLE_TEXT = {PLANNER: PLANNER_ROLE, WORKER: WORKER_ROLE, SINGLE: SINGLE_ROLE}
# Workers cannot spawn workers; the single agent gets the workers' tools directly.
ROLE_TOOLS = {
    PLANNER: [SUBAGENT_SCHEMA],
    WORKER: [SEARCH_SCHEMA, OPEN_SCHEMA],
    SINGLE: [SEARCH_SCHEMA, OPEN_SCHEMA],
}

QUESTION_INSTRUCTION = "Give the final answer inside \\boxed{}."

FINAL_SUMMARY_INSTRUCTION = (
    "Stop and do not call tools. Write a short report: the conclusion, the facts and the sources."
)

EMPTY_REPORT = "(the worker returned no report)"


def system_prompt(role: str) -> str:
    """Full system-message text of a role: role text + its tool schemas (Qwen3 `# Tools` section).
    Scripted demonstrations and rollouts both use this, so SFT and RL see the same prompt."""
    if role not in ROLE_TEXT:
        raise ValueError(f"role={role!r}; expected one of {sorted(ROLE_TEXT)}")
    return ChatFormat.system_prompt(ROLE_TEXT[role], ROLE_TOOLS[role])


def question_prompt(question: str) -> str:
    """User message of a planner or single agent."""
    return f"{question.strip()}\n{QUESTION_INSTRUCTION}"


def worker_recap(main_task: str, subtask: str) -> str:
    """User message of a worker: the planner's question for context, then its own subtask."""
    return (
        f"The main task is: {main_task.strip()}\n"
        f"Your subtask: {subtask.strip()}\n"
        "Do only your subtask and report what you find."
    )


def malformed_call_text(reason: str) -> str:
    """Tool response shown to the model when its tool call could not be executed."""
    return f"Error: invalid tool call ({reason}). Write valid tool calls or answer."


_TOOL_MARKUP = re.compile(
    r"<tool_call>.*?(?:</tool_call>|$)|<tool_response>.*?(?:</tool_response>|$)", re.DOTALL
)
_LEFTOVER_TAGS = re.compile(r"</?(?:tool_call|tool_response|think)>")
_BLANK_LINES = re.compile(r"\n{3,}")


def clean_report(text: str, max_chars: int) -> str:
    """The worker's final turn as the planner will read it: reasoning, tool-call markup and control
    tokens removed, blank runs collapsed, cut to `max_chars` characters."""
    text = strip_think(text)
    text = _TOOL_MARKUP.sub("", text)
    text = _LEFTOVER_TAGS.sub("", text)
    for token in CONTROL_TOKENS:
        text = text.replace(token, "")
    text = _BLANK_LINES.sub("\n\n", text).strip()
    if not text:
        return EMPTY_REPORT[:max_chars]
    return text[:max_chars].rstrip()
