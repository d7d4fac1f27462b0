"""Qwen3 chat format over any Hugging Face tokenizer, and tool-call markup <-> structured calls.

Token-in, token-out: a rollout's context is built from token-id pieces (the prompt, the ids the
policy sampled, then fixed non-trainable blocks such as tool responses) and never re-tokenised.
`render()` builds a whole conversation from the same pieces, tokenising each piece on its own, so
(a) its trainable mask is exact (assistant content + its closing `<|im_end|>`), and (b) rendering a
message list gives exactly the ids a rollout assembles incrementally:

    render(msgs + [assistant_1, tool_1, assistant_2]) ==
        prompt_ids(msgs) + encode(assistant_1) + [im_end] + tool_response_ids(tool_1)
        + encode(assistant_2) + [im_end] + turn_end_ids()

Text layout (Qwen3's documented format):
    <|im_start|>system\n{role text}\n\n# Tools ... <tools>\n{schema}\n...</tools> ...<|im_end|>\n
    <|im_start|>user\n{question}<|im_end|>\n
    <|im_start|>assistant\n{content}<|im_end|>\n
    <|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n
    <|im_start|>assistant\n                                   <- generation prompt
Assistant content is kept verbatim (think text included): unlike Qwen3's own template we never
rewrite history, because a rollout's history is exactly what the model saw when it sampled.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

from matpo_jax.tokenizer_training import ENDOFTEXT, IM_END, IM_START

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# A small Jinja chat template producing the same text as ChatFormat.render (used to check render
# against `tokenizer.apply_chat_template`, and attached to tokenizers we train).
QWEN3_STYLE_CHAT_TEMPLATE = (
    "{%- set ns = namespace(start=0) -%}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set ns.start = 1 -%}"
    "{%- endif -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if ns.start == 1 -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- " + json.dumps(_TOOLS_PREAMBLE) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- " + json.dumps(_TOOLS_POSTAMBLE) + " + '<|im_end|>\\n' -}}"
    "{%- elif ns.start == 1 -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages[ns.start:] -%}"
    "{%- if message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- set content = message.content or '' -%}"
    "{{- '<|im_start|>assistant\\n' + content -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}"
    "{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_ROLES = ("system", "user", "assistant", "tool")


class ChatFormatError(ValueError):
    """A message list or tokenizer that cannot be rendered (names the message / token)."""


@dataclasses.dataclass(frozen=True)
class _Piece:
    text: str
    trainable: bool = False


class ChatFormat:
    """Qwen3 chat rendering over a Hugging Face tokenizer, built from separately tokenised pieces."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._fixed_cache: dict[str, tuple[int, ...]] = {}
        self.im_start_id = self._single_token_id(IM_START)
        self.im_end_id = self._single_token_id(IM_END)
        self.tool_call_end_id = self._single_token_id(TOOL_CALL_CLOSE)
        self.endoftext_id = self._single_token_id(ENDOFTEXT)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_id = int(eos) if eos is not None else self.im_end_id
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else self.endoftext_id
        # Tokens that end an assistant turn's sampling (as Qwen3's generation config: <|im_end|> and
        # <|endoftext|>). A tool-call turn then reads `...</tool_call><|im_end|>`; a sampler that
        # also stops at tool_call_end_id passes closed=False to the pieces below.
        self.stop_ids = tuple(sorted({self.eos_id, self.im_end_id, self.endoftext_id}))

    @classmethod
    def from_pretrained(cls, path) -> "ChatFormat":
        """Loads the tokenizer from a local directory (never downloads)."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path), local_files_only=True))

    # ----------------------------------------------------------------- tokenisation primitives
    def encode(self, text: str) -> list[int]:
        """Token ids of one piece of text (no BOS/EOS added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _fixed(self, text: str) -> tuple[int, ...]:
        # The template's constant pieces (headers, tags) are tokenised once per instance.
        ids = self._fixed_cache.get(text)
        if ids is None:
            ids = self._fixed_cache[text] = tuple(self.encode(text))
        return ids

    def _piece_ids(self, piece: _Piece) -> Sequence[int]:
        return self._fixed(piece.text) if piece.text in _TEMPLATE_PIECES else self.encode(piece.text)

    def decode(self, ids: Sequence[int]) -> str:
        """Exact text of `ids`, control tokens included."""
        return self.tokenizer.decode(
            [int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def _single_token_id(self, token: str) -> int:
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ChatFormatError(f"tokenizer does not encode {token!r} as one token (got {ids})")
        return int(ids[0])

    # ----------------------------------------------------------------- prompts
    @staticmethod
    def system_prompt(role_text: str, tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """System-message text: the role text, then (if any) the Qwen3 `# Tools` section."""
        if not tools:
            return role_text
        schemas = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
        prefix = role_text + "\n\n" if role_text else ""
        return prefix + _TOOLS_PREAMBLE + schemas + _TOOLS_POSTAMBLE

    # ----------------------------------------------------------------- whole conversations
    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[list[int], list[bool]]:
        """Token ids and trainable mask of a conversation (OpenAI-style message dicts).

        `tools` (optional) are appended to the first system message as Qwen3 does; roles that
        already carry their tool section in the system text (see system_prompt) pass none.
        """
        ids: list[int] = []
        trainable: list[bool] = []
        for piece in self._pieces(messages, add_generation_prompt, tools):
            piece_ids = self._piece_ids(piece)
            ids.extend(piece_ids)
            trainable.extend([piece.trainable] * len(piece_ids))
        return ids, trainable

    def render_text(self, messages, add_generation_prompt: bool = False, tools=None) -> str:
        """The text render() tokenises (equal to decode(render(...)[0]))."""
        return "".join(p.text for p in self._pieces(messages, add_generation_prompt, tools))

    def prompt_ids(self, messages, tools=None) -> list[int]:
        """Ids of a conversation followed by the assistant generation prompt."""
        return self.render(messages, add_generation_prompt=True, tools=tools)[0]

    # ----------------------------------------------------------------- incremental pieces
    def assistant_header_ids(self) -> list[int]:
        """`<|im_start|>assistant\\n`: the generation prompt."""
        return list(self._fixed(IM_START + "assistant\n"))

    def turn_end_ids(self, closed: bool = True) -> list[int]:
        """What follows a sampled assistant turn. `closed`: the sampled ids already end with
        `<|im_end|>` (the sampler stopped on it); otherwise (stopped at `</tool_call>`, or cut off)
        the `<|im_end|>` is supplied here, as a non-trainable token."""
        return ([] if closed else [self.im_end_id]) + list(self._fixed("\n"))

    def tool_response_ids(self, text: str | Sequence[str], closed: bool = True) -> list[int]:
        """Non-trainable block after a sampled tool-call turn: end of that turn, a user turn with one
        `<tool_response>` per result, and the next assistant header."""
        texts = [text] if isinstance(text, str) else list(text)
        block = self._ids_of(self._tool_block(texts))
        return self.turn_end_ids(closed) + block + self.assistant_header_ids()

    def user_turn_ids(self, text: str, closed: bool = True) -> list[int]:
        """Non-trainable block after a sampled turn: end of that turn, a user turn (e.g. the
        final-summary instruction), and the next assistant header."""
        turn = self._ids_of(self._plain_turn("user", text))
        return self.turn_end_ids(closed) + turn + self.assistant_header_ids()

    # ----------------------------------------------------------------- internals
    def _ids_of(self, pieces: Sequence[_Piece]) -> list[int]:
        return [i for piece in pieces for i in self._piece_ids(piece)]

    def _pieces(self, messages, add_generation_prompt, tools) -> list[_Piece]:
        messages = [_check_message(i, m) for i, m in enumerate(messages)]
        pieces: list[_Piece] = []
        start = 0
        if messages and messages[0]["role"] == "system":
            start = 1
            pieces += self._plain_turn("system", self.system_prompt(messages[0]["content"], tools))
        elif tools:
            pieces += self._plain_turn("system", self.system_prompt("", tools))
        i = start
        while i < len(messages):
            role = messages[i]["role"]
            if role == "tool":  # consecutive tool results share one user turn (Qwen3)
                j = i
                while j < len(messages) and messages[j]["role"] == "tool":
                    j += 1
                pieces += self._tool_block([m["content"] for m in messages[i:j]])
                i = j
                continue
            if role == "assistant":
                pieces += [
                    _Piece(IM_START + "assistant\n"),
                    _Piece(_assistant_text(messages[i]), trainable=True),
                    _Piece(IM_END, trainable=True),
                    _Piece("\n"),
                ]
            else:
                pieces += self._plain_turn(role, messages[i]["content"])
            i += 1
        if add_generation_prompt:
            pieces.append(_Piece(IM_START + "assistant\n"))
        return [p for p in pieces if p.text]

    @staticmethod
    def _plain_turn(role: str, content: str) -> list[_Piece]:
        return [_Piece(f"{IM_START}{role}\n"), _Piece(content), _Piece(IM_END), _Piece("\n")]

    @staticmethod
    def _tool_block(texts: Sequence[str]) -> list[_Piece]:
        pieces = [_Piece(IM_START + "user")]
        for text in texts:
            pieces += [
                _Piece(f"\n{TOOL_RESPONSE_OPEN}\n"),
                _Piece(text),
                _Piece(f"\n{TOOL_RESPONSE_CLOSE}"),
            ]
        return pieces + [_Piece(IM_END), _Piece("\n")]


_TEMPLATE_PIECES = frozenset(
    {
        "\n",
        IM_END,
        IM_START + "user",
        f"\n{TOOL_RESPONSE_OPEN}\n",
        f"\n{TOOL_RESPONSE_CLOSE}",
    }
    | {f"{IM_START}{role}\n" for role in _ROLES}
)


def _check_message(index: int, message: Mapping[str, Any]) -> dict:
    if not isinstance(message, Mapping):
        raise ChatFormatError(f"messages[{index}] is a {type(message).__name__}, not a dict")
    role = message.get("role")
    if role not in _ROLES:
        raise ChatFormatError(f"messages[{index}].role={role!r}; expected one of {_ROLES}")
    content = message.get("content")
    if content is None and role == "assistant" and message.get("tool_calls"):
        content = ""
    if not isinstance(content, str):
        raise ChatFormatError(
            f"messages[{index}].content must be a string, got {type(content).__name__}"
        )
    return {**message, "content": content}


def _assistant_text(message: Mapping[str, Any]) -> str:
    """Assistant content plus any structured `tool_calls`, written as Qwen3 tool-call markup."""
    text = message["content"]
    for n, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        args_json = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        sep = "\n" if (text and n == 0) or n > 0 else ""
        body = f'{{"name": "{fn["name"]}", "arguments": {args_json}}}'
        text += f"{sep}{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"
    return text


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The markup a model writes to call a tool (used by scripted demonstrations)."""
    return _assistant_text({"content": "", "tool_calls": [{"name": name, "arguments": dict(arguments)}]})


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
    """The one tool call in an assistant turn, checked against the tools in that role's prompt.

    Raises MalformedToolCall(reason) when there is no call or more than one, a tag is unterminated,
    the body is not a JSON object {"name": str, "arguments": object}, the tool is unknown, or the
    arguments do not match its JSON schema. Think text is ignored.
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
    try:
        call = json.loads(raw)
    except json.JSONDecodeError as e:
        raise MalformedToolCall(f"tool call is not valid JSON: {e.msg} at position {e.pos}") from None
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


extract_final_answer = extract_boxed


_THINK_BLOCK = re.compile(re.escape(THINK_OPEN) + r".*?" + re.escape(THINK_CLOSE), re.DOTALL)


def strip_think(text: str) -> str:
    """Text without reasoning: `<think>...</think>` blocks, anything before a stray `</think>`
    (the opening tag was in the prompt), and an unterminated trailing `<think>...`."""
    text = _THINK_BLOCK.sub("", text)
    if THINK_CLOSE in text:
        text = text.rsplit(THINK_CLOSE, 1)[1]
    if THINK_OPEN in text:
        text = text.split(THINK_OPEN, 1)[0]
    return text.strip()
