"""Reading what the model wrote: tool-call markup -> structured calls, the final boxed answer,
think blocks."""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

from matpo_jax.chat.special_tokens import THINK_CLOSE, THINK_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN


# ===================================================================== tool-call parsing
@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


class MalformedToolCall(ValueError):
    """A tool call the model wrote that cannot be executed; `reason` is shown to the model."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def has_tool_call(text: str) -> bool:
    """Whether the (think-stripped) text attempts a tool call."""
    return TOOL_CALL_OPEN in strip_think(text)


def tool_name(schema: Mapping[str, Any]) -> str:
    """Name of a tool schema in OpenAI function format (or a bare function schema)."""
    return schema.get("function", schema)["name"]


def tool_parameters(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    return schema.get("function", schema).get("parameters") or {"type": "object", "properties": {}}


def parse_tool_call(text: str, tools: Sequence[Mapping[str, Any]]) -> ToolCall:
    """The one tool call in a text (a turn, or one block of split_tool_calls), checked against
    the tools in that role's prompt.

    Raises MalformedToolCall(reason), and nothing else, when there is no call or more than one, a
    tag is unterminated, the body is not a JSON object {"name": str, "arguments": object} (JSON
    nested too deeply, numbers over Python's digit limit and lone surrogates included), the tool
    is unknown, or the arguments do not match its JSON schema. Think text is ignored.
    """
    body_text = strip_think(text)
    start = body_text.find(TOOL_CALL_OPEN)
    if start < 0:
        raise MalformedToolCall(f"no {TOOL_CALL_OPEN} tag")
    end = body_text.find(TOOL_CALL_CLOSE, start)
    if end < 0:
        raise MalformedToolCall(f"unterminated {TOOL_CALL_OPEN}: missing {TOOL_CALL_CLOSE}")
    if TOOL_CALL_OPEN in body_text[end:]:
        raise MalformedToolCall("more than one tool call in one turn; make exactly one")
    raw = body_text[start + len(TOOL_CALL_OPEN) : end].strip()
    call = _load_json(raw)
    if not isinstance(call, dict):
        raise MalformedToolCall("tool call must be a JSON object with 'name' and 'arguments'")
    name, arguments = call.get("name"), call.get("arguments")
    if not isinstance(name, str):
        raise MalformedToolCall("tool call has no string 'name'")
    unexpected = sorted(set(call) - {"name", "arguments"})
    if unexpected:
        raise MalformedToolCall(f"unexpected keys in tool call: {unexpected}")
    by_name = {tool_name(t): t for t in tools}
    if name not in by_name:
        raise MalformedToolCall(f"unknown tool {name!r}; available: {sorted(by_name)}")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise MalformedToolCall(f"'arguments' of {name} must be a JSON object")
    check_arguments(name, arguments, tool_parameters(by_name[name]))
    return ToolCall(name, arguments)


def split_tool_calls(text: str) -> list[str]:
    """One text per `<tool_call>` block of the think-stripped turn, in the order written (the
    last may be unterminated): a turn may call several tools, as Qwen3's template allows ("You
    may call one or more functions"); each block is read by parse_tool_call."""
    parts = strip_think(text).split(TOOL_CALL_OPEN)[1:]
    return [TOOL_CALL_OPEN + part for part in parts]


def _load_json(raw: str) -> Any:
    """The call's JSON; every way it can fail is a MalformedToolCall (the model reads why)."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise MalformedToolCall(f"tool call is not valid JSON: {e.msg} at position {e.pos}") from None
    except RecursionError:
        raise MalformedToolCall("tool call JSON is nested too deeply") from None
    except ValueError as e:  # e.g. an integer over Python's digit limit
        raise MalformedToolCall(f"tool call JSON has an unreadable value ({_first_line(e)})") from None
    try:  # lone surrogates ("\ud800") parse but cannot be sent or stored as UTF-8
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedToolCall("tool call contains invalid Unicode (a lone surrogate escape)") from None
    except (RecursionError, ValueError):
        raise MalformedToolCall("tool call JSON is nested too deeply") from None
    return value


def _first_line(error: Exception) -> str:
    return str(error).split("\n", 1)[0].split(":", 1)[0][:100]


_JSON_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def check_arguments(name: str, arguments: Mapping[str, Any], parameters: Mapping[str, Any]) -> None:
    """Checks call arguments against an object JSON schema (the subset tool schemas use: required,
    properties with type/enum/minimum/maximum; extra arguments are always rejected)."""
    properties = parameters.get("properties", {})
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        raise MalformedToolCall(f"{name}: missing required argument(s) {missing}")
    extra = [k for k in arguments if k not in properties]
    if extra:
        raise MalformedToolCall(f"{name}: unexpected argument(s) {extra}; allowed: {sorted(properties)}")
    for key, value in arguments.items():
        spec = properties[key]
        types = spec.get("type")
        types = [types] if isinstance(types, str) else (types or [])
        if types and not any(_JSON_TYPES[t](value) for t in types if t in _JSON_TYPES):
            raise MalformedToolCall(
                f"{name}: argument {key!r} must be {'/'.join(types)}, got {_json_type(value)}"
            )
        if "enum" in spec and value not in spec["enum"]:
            raise MalformedToolCall(f"{name}: argument {key!r} must be one of {spec['enum']}")
        if "minimum" in spec and isinstance(value, (int, float)) and value < spec["minimum"]:
            raise MalformedToolCall(f"{name}: argument {key!r} must be >= {spec['minimum']}")
        if "maximum" in spec and isinstance(value, (int, float)) and value > spec["maximum"]:
            raise MalformedToolCall(f"{name}: argument {key!r} must be <= {spec['maximum']}")
        if isinstance(value, str) and spec.get("minLength") and len(value) < spec["minLength"]:
            raise MalformedToolCall(f"{name}: argument {key!r} must not be empty")


def _json_type(value: Any) -> str:
    for type_name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _JSON_TYPES[type_name](value):
            return type_name
    return type(value).__name__


# ===================================================================== answers and think text
_BOXED = "\\boxed{"


def extract_boxed(text: str) -> str | None:
    """Contents of the last complete `\\boxed{...}` (nested braces allowed), else None."""
    start = text.rfind(_BOXED)
    while start >= 0:
        depth, i = 1, start + len(_BOXED)
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + len(_BOXED) : i].strip()
            i += 1
        start = text.rfind(_BOXED, 0, start)  # unterminated: fall back to an earlier one
    return None



_THINK_BLOCK = re.compile(re.escape(THINK_OPEN) + r".*?" + re.escape(THINK_CLOSE), re.DOTALL)


def answer_text(text: str) -> str:
    """What a turn answers, outside its reasoning: the text after the last `</think>` (all of it
    when there is none), less an unterminated `<think>...` (reasoning cut off by the turn cap).
    A `\\boxed{}` written only while thinking is therefore no answer."""
    if THINK_CLOSE in text:
        text = text.rsplit(THINK_CLOSE, 1)[1]
    return text.split(THINK_OPEN, 1)[0]


def strip_think(text: str) -> str:
    """Text without reasoning: `<think>...</think>` blocks, anything before a stray `</think>`
    (the opening tag was in the prompt), and an unterminated trailing `<think>...`."""
    text = _THINK_BLOCK.sub("", text)
    if THINK_CLOSE in text:
        text = text.rsplit(THINK_CLOSE, 1)[1]
    if THINK_OPEN in text:
        text = text.split(THINK_OPEN, 1)[0]
    return text.strip()
