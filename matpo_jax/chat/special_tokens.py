"""Qwen3's special tokens and markup tags, as text (the chat format, the parser and the tokenizer
trainer all name them from here)."""

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Control tokens: never produced by ordinary text, hidden by decode(skip_special_tokens=True).
CONTROL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Markup tags: single tokens, but ordinary text from the model's point of view (as in Qwen3).
TAG_TOKENS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE,
              THINK_OPEN, THINK_CLOSE)
QWEN3_SPECIAL_TOKENS = CONTROL_TOKENS + TAG_TOKENS
