"""The tool calls of one decoded context (a transcripts.jsonl agent's text), in order, each with
the response the agent read after it. The chat markup is Qwen3's, as matpo_jax.chat writes it."""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Mapping

_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?=<\|im_end\|>|<\|im_start\|>|\Z)", re.S)
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)


@dataclasses.dataclass(frozen=True)
class ToolStep:
    name: str  # "" for a call that is not valid JSON with a name
    arguments: Mapping
    response: str | None  # None when the context ends before the answer


def tool_steps(text: str) -> list[ToolStep]:
    """The tool calls of one decoded context, each with the response the agent read after it."""
    steps: list[ToolStep] = []
    waiting: list[int] = []  # indices of calls of the last assistant turn not yet answered
    for role, content in _TURN.findall(text):
        if role == "assistant":
            waiting = []
            for raw in _CALL.findall(content):
                try:
                    call = json.loads(raw)
                    name, arguments = str(call["name"]), call.get("arguments") or {}
                    if not isinstance(arguments, Mapping):
                        raise TypeError
                except (ValueError, KeyError, TypeError):
                    name, arguments = "", {}
                waiting.append(len(steps))
                steps.append(ToolStep(name, arguments, None))
        else:
            for response in _RESPONSE.findall(content):
                if waiting:
                    index = waiting.pop(0)
                    steps[index] = dataclasses.replace(steps[index], response=response)
    return steps
