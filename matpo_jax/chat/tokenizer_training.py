"""Train a small byte-level BPE tokenizer with Qwen3's special tokens, saved in Hugging Face format.

Nothing can be downloaded here, so the synthetic world and the tests train their own tokenizer on
their own text. It follows Qwen3's layout where it matters to the rest of the code: byte-level BPE
(every string round-trips through encode/decode), the chat control tokens and the tool/think tags as
single tokens, `<|im_end|>` as the end-of-turn / eos token and `<|endoftext|>` as padding.
"""
from __future__ import annotations

import os
from typing import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from matpo_jax.chat.special_tokens import (CONTROL_TOKENS, ENDOFTEXT, IM_END, QWEN3_SPECIAL_TOKENS,
                                           TAG_TOKENS)
from matpo_jax.chat.template import QWEN3_STYLE_CHAT_TEMPLATE

# Pre-split text the way GPT-4/Qwen-style tokenizers do (contractions, words with one leading
# non-letter, numbers with one leading space, punctuation runs, newlines, spaces) so merges never
# cross word boundaries. Written for this module, with two departures from Qwen's:
# - whole numbers (not digit by digit): a year or population the model must copy from a page is
#   then one token, not four, which a tiny model copies far more reliably;
# - punctuation never takes the newlines after it ("Labs." + "\n", not "Labs" + ".\n"): a fact
#   copied from a page then ends in the same "." token as the sentence the model writes, whether
#   the page line is followed by another line, by the end of a tool response or by anything else.
#   (Under Qwen's rule a value ending a page line was followed by ".\n"; tokenising the chat
#   template's text runs whole, as apply_chat_template does, extended that to the last line of
#   every tool response, and the demo's validation accuracy after SFT fell from 12.3% to 5.2%,
#   mean of 4 seeds: docs/findings.md.)
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"| ?\p{N}+"
    r"| ?[^\s\p{L}\p{N}]+"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)
# Bumped whenever the rule above changes: a data dir's trained tokenizer is cached under a name
# holding it, so an old tokenizer is never reused by code that splits text differently.
PRE_TOKENIZER_VERSION = 2


class TokenizerTrainingError(ValueError):
    """Bad arguments to train_tokenizer (names the argument)."""


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike | None = None
) -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE on `texts` and returns it as a Hugging Face fast tokenizer.

    The vocabulary holds the 256 byte symbols, the Qwen3 special tokens and learned merges up to
    `vocab_size`. With `out_dir`, the tokenizer is also saved there (loadable offline with
    `AutoTokenizer.from_pretrained(out_dir)`), with a Qwen3-style chat template attached.
    """
    min_size = 256 + len(QWEN3_SPECIAL_TOKENS)
    if vocab_size < min_size:
        raise TokenizerTrainingError(
            f"vocab_size={vocab_size} must be >= {min_size} (bytes + special tokens)"
        )

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(QWEN3_SPECIAL_TOKENS),  # ids 0..8, in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any byte is encodable
        show_progress=False,
    )
    core.train_from_iterator(_non_empty(texts), trainer=trainer)
    # The trainer registers all of them as special; re-register the tags as ordinary added tokens
    # (same ids) so decode(skip_special_tokens=True) keeps tool-call markup, as in Qwen3.
    core.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAG_TOKENS])


    hf = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,  # Qwen3 instruct convention: a finished turn is the end of generation
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,  # decode must reproduce the text byte for byte
        model_max_length=1 << 20,
    )
    hf.add_special_tokens({"additional_special_tokens": list(CONTROL_TOKENS)})
    hf.chat_template = QWEN3_STYLE_CHAT_TEMPLATE
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        hf.save_pretrained(os.fspath(out_dir))
    return hf


def _non_empty(texts: Iterable[str]):
    for text in texts:
        if text:
            yield text
