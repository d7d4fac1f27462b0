"""Chat format over any Hugging Face tokenizer (Qwen3 conventions), reading tool calls and answers
out of model text, and training a small tokenizer with Qwen3's special tokens."""
from matpo_jax.chat.format import ChatFormat, ChatFormatError, format_tool_call
from matpo_jax.chat.parsing import (MalformedToolCall, ToolCall, answer_text, check_arguments,
                                    extract_boxed, has_tool_call, parse_tool_call,
                                    split_tool_calls, strip_think, tool_name, tool_parameters)
from matpo_jax.chat.special_tokens import (CONTROL_TOKENS, ENDOFTEXT, IM_END, IM_START,
                                           QWEN3_SPECIAL_TOKENS, TAG_TOKENS, THINK_CLOSE,
                                           THINK_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN,
                                           TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN)
from matpo_jax.chat.template import QWEN3_STYLE_CHAT_TEMPLATE
