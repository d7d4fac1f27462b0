"""The ChatML chat format of Qwen3 (and SmolLM2) over any Hugging Face tokenizer whose vocabulary
has `<|im_start|>`, `<|im_end|>` and `<|endoftext|>`, and tool-call markup <-> structured calls.

Token-in, token-out: a rollout's context is built from token-id pieces (the prompt, the ids the
policy sampled, then fixed non-trainable blocks such as tool responses) and never re-tokenised.
`render()` builds a whole conversation from the same pieces, so (a) its trainable mask is exact
(assistant content + its closing `<|im_end|>`), and (b) rendering a message list gives exactly the
ids a rollout assembles incrementally:

    render(msgs + [assistant_1, tool_1, assistant_2]) ==
        prompt_ids(msgs) + encode(assistant_1) + [im_end] + tool_response_ids(tool_1)
        + encode(assistant_2) + [im_end] + turn_end_ids()

Each assistant content is tokenised on its own; every run of template text between two of them
(turn ends, headers, user turns, tool responses) is tokenised as ONE string, as the checkpoint's own
chat template would tokenise it. So with Qwen3's tokenizer `render` equals
`tokenizer.apply_chat_template(..., tools=...)` id for id wherever the template keeps the history
as written (BPE merges such as "." + "\n" inside a tool response come out the same).

Text layout (Qwen3's documented format):
    <|im_start|>system\n{role text}\n\n# Tools ... <tools>\n{schema}\n...</tools> ...<|im_end|>\n
    <|im_start|>user\n{question}<|im_end|>\n
    <|im_start|>assistant\n{content}<|im_end|>\n
    <|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n
    <|im_start|>assistant\n                                   <- generation prompt
With `enable_thinking=False` (Qwen3's non-thinking mode) every generation prompt, and the header
of every assistant turn render() writes, is followed by an empty think block `<think>\n\n</think>
\n\n` (non-trainable), as `apply_chat_template(..., enable_thinking=False)` writes it.
Assistant content is kept verbatim (think text included). Qwen3's own template rewrites history:
it drops the `<think>` block of assistant turns before the latest user query and re-spaces the
think block of later ones. We deliberately do not: a rollout's history is exactly the ids the
model saw when it sampled its next turn, and training on a re-rendered history would train on
contexts the policy never had (a known source of train/inference drift).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

from matpo_jax.chat.special_tokens import (ENDOFTEXT, IM_END, IM_START, TOOL_CALL_CLOSE,
                                           TOOL_CALL_OPEN, TOOL_RESPONSE_CLOSE,
                                           TOOL_RESPONSE_OPEN)
from matpo_jax.chat.template import TOOLS_POSTAMBLE, TOOLS_PREAMBLE

_ROLES = ("system", "user", "assistant", "tool")
TOKENIZER_FILE = "tokenizer.json"
GENERATION_CONFIG_FILE = "generation_config.json"
# What Qwen3's template writes after the generation prompt in non-thinking mode.
EMPTY_THINK = "<think>\n\n</think>\n\n"


class ChatFormatError(ValueError):
    """A message list or tokenizer that cannot be rendered (names the message / token)."""


@dataclasses.dataclass(frozen=True)
class _Piece:
    text: str
    trainable: bool = False


class ChatFormat:
    """Qwen3 chat rendering over a Hugging Face tokenizer (its special tokens, wherever their ids
    are), from token-id pieces: each assistant turn, and the template text between them."""

    def __init__(self, tokenizer, *, eos_ids: Sequence[int] = (), enable_thinking: bool = True):
        """eos_ids: more ids that end a turn (a checkpoint's generation_config.json eos ids).
        enable_thinking: False writes Qwen3's empty think block after each generation prompt."""
        self.tokenizer = tokenizer
        self.enable_thinking = bool(enable_thinking)
        self._assistant_header = IM_START + "assistant\n" + ("" if enable_thinking
                                                              else EMPTY_THINK)
        self._fixed_cache: dict[str, tuple[int, ...]] = {}
        self.im_start_id = self._single_token_id(IM_START)
        self.im_end_id = self._single_token_id(IM_END)
        # Qwen3 has `</tool_call>` as one token; other families (SmolLM2, Llama) spell the tags
        # in ordinary tokens, and a turn then ends only at its turn-end token.
        self.tool_call_end_id = self._single_token_id(TOOL_CALL_CLOSE, required=False)
        self.endoftext_id = self._single_token_id(ENDOFTEXT)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_id = int(eos) if eos is not None else self.im_end_id
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else self.endoftext_id
        # Tokens that end an assistant turn's sampling (as Qwen3's generation config: <|im_end|> and
        # <|endoftext|>). A tool-call turn then reads `...</tool_call><|im_end|>`; a sampler that
        # also stops at tool_call_end_id passes closed=False to the pieces below.
        # The checkpoint's eos ids (generation_config.json) stop a turn too.
        self.stop_ids = tuple(sorted({self.eos_id, self.im_end_id, self.endoftext_id,
                                      *(int(i) for i in eos_ids)}))
        self._eos_ids = tuple(int(i) for i in eos_ids)

    @classmethod
    def from_pretrained(cls, path, *, enable_thinking: bool = True) -> "ChatFormat":
        """Loads the tokenizer (and its special tokens) from a local Hugging Face directory, e.g. a
        Qwen3 checkpoint's, with the eos ids of its generation_config.json if it has one; never
        downloads."""
        from transformers import AutoTokenizer

        path = os.fspath(path)
        if not os.path.isfile(os.path.join(path, TOKENIZER_FILE)):
            raise ChatFormatError(f"{path}: no {TOKENIZER_FILE}; expected a Hugging Face tokenizer "
                                  f"directory (e.g. a Qwen3 checkpoint's)")
        return cls(AutoTokenizer.from_pretrained(path, local_files_only=True),
                   eos_ids=generation_eos_ids(path), enable_thinking=enable_thinking)

    def with_thinking(self, enable_thinking: bool) -> "ChatFormat":
        """The same tokenizer and stop ids in thinking (True) or non-thinking mode."""
        if enable_thinking == self.enable_thinking:
            return self
        return ChatFormat(self.tokenizer, eos_ids=self._eos_ids, enable_thinking=enable_thinking)

    @property
    def id_count(self) -> int:
        """Rows a model's embedding needs for this tokenizer: its largest id + 1."""
        added = getattr(self.tokenizer, "added_tokens_decoder", None) or {0: None}
        return max(len(self.tokenizer), max(added) + 1)

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

    def _single_token_id(self, token: str, required: bool = True) -> int | None:
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            if not required:
                return None
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
        return prefix + TOOLS_PREAMBLE + schemas + TOOLS_POSTAMBLE

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
        for piece in _runs(self._pieces(messages, add_generation_prompt, tools)):
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
        """`<|im_start|>assistant\\n` (and the empty think block in non-thinking mode): the
        generation prompt."""
        return list(self._fixed(self._assistant_header))

    def turn_end_ids(self, closed: bool = True) -> list[int]:
        """What follows a sampled assistant turn. `closed`: the sampled ids already end with
        `<|im_end|>` (the sampler stopped on it); otherwise (stopped at `</tool_call>`, or cut off)
        the `<|im_end|>` is supplied here, as a non-trainable token."""
        return ([] if closed else [self.im_end_id]) + list(self._fixed("\n"))

    def tool_response_ids(self, text: str | Sequence[str], closed: bool = True) -> list[int]:
        """Non-trainable block after a sampled tool-call turn: end of that turn, a user turn with one
        `<tool_response>` per result, and the next assistant header."""
        texts = [text] if isinstance(text, str) else list(text)
        return self._continuation(self._tool_block(texts), closed)

    def user_turn_ids(self, text: str, closed: bool = True) -> list[int]:
        """Non-trainable block after a sampled turn: end of that turn, a user turn (e.g. the
        final-summary instruction), and the next assistant header."""
        return self._continuation(self._plain_turn("user", text), closed)

    def _continuation(self, turn: Sequence[_Piece], closed: bool) -> list[int]:
        # One run of text, tokenised as render() tokenises it: "\n" + turn + assistant header.
        pieces = [_Piece("\n"), *turn, _Piece(self._assistant_header)]
        return ([] if closed else [self.im_end_id]) + self._ids_of(pieces)

    # ----------------------------------------------------------------- internals
    def _ids_of(self, pieces: Sequence[_Piece]) -> list[int]:
        return [i for piece in _runs(pieces) for i in self._piece_ids(piece)]

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
                    _Piece(self._assistant_header),
                    _Piece(_assistant_text(messages[i]), trainable=True),
                    _Piece(IM_END, trainable=True),
                    _Piece("\n"),
                ]
            else:
                pieces += self._plain_turn(role, messages[i]["content"])
            i += 1
        if add_generation_prompt:
            pieces.append(_Piece(self._assistant_header))
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


def _runs(pieces: Sequence[_Piece]) -> list[_Piece]:
    """Adjacent non-trainable pieces joined into one (tokenised together); trainable ones kept."""
    out: list[_Piece] = []
    for piece in pieces:
        if out and not piece.trainable and not out[-1].trainable:
            out[-1] = _Piece(out[-1].text + piece.text)
        else:
            out.append(piece)
    return out


_TEMPLATE_PIECES = frozenset(
    {
        "\n",
        IM_END,
        IM_START + "user",
        f"\n{TOOL_RESPONSE_OPEN}\n",
        f"\n{TOOL_RESPONSE_CLOSE}",
    }
    | {f"{IM_START}{role}\n" for role in _ROLES}
    | {IM_START + "assistant\n" + EMPTY_THINK}
)


def generation_eos_ids(path: str) -> tuple[int, ...]:
    """The eos ids of a checkpoint directory's generation_config.json (none without the file)."""
    file = os.path.join(path, GENERATION_CONFIG_FILE)
    if not os.path.isfile(file):
        return ()
    try:
        with open(file, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token_id")
    except (OSError, ValueError, AttributeError) as error:
        raise ChatFormatError(f"{file}: not a readable JSON object ({error})") from None
    eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in eos):
        raise ChatFormatError(f"{file}: eos_token_id must be a token id or a list of them, "
                              f"got {eos!r}")
    return tuple(eos)


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
