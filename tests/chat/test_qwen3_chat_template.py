"""ChatFormat over the real Qwen3 tokenizer and its official chat template (fixtures/
qwen3_real_tokenizer.py): the ids equal `apply_chat_template` where the template keeps history as
written, and rollout contexts are built token-in/token-out where it does not."""
import numpy as np
import pytest

from matpo_jax.agents import prompts
from matpo_jax.chat import ChatFormat, ChatFormatError, format_tool_call
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA, SUBAGENT_SCHEMA

TOOLS = [SEARCH_SCHEMA, OPEN_SCHEMA]
CALL = format_tool_call("search", {"query": "founder of Northwind"})
# Canonical think layout (what Qwen3 writes and its template re-renders unchanged).
THINK_CALL = "<think>\nI should search first.\n</think>\n\n" + CALL
THINK_ANSWER = "<think>\nThe page says Lyon.\n</think>\n\nShe was born in \\boxed{Lyon}."
# Results ending in punctuation: "." and the template's "\n" merge into one pre-token when the
# block is tokenised as one string (as the template does), not when tokenised piece by piece.
RESULTS = ["1. Northwind Company (id: doc-northwind)\nIts founder was Alice Moreau.",
           "Alice Moreau was born in Lyon."]


@pytest.fixture(scope="module")
def qwen3_chat(real_qwen3_tokenizer_dir):
    return ChatFormat.from_pretrained(real_qwen3_tokenizer_dir)


def template_ids(chat, messages, **kwargs):
    out = chat.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    return list(out)


def test_special_tokens_come_from_the_checkpoint_at_qwen3_ids(qwen3_chat):
    cf = qwen3_chat
    assert (cf.endoftext_id, cf.im_start_id, cf.im_end_id) == (151643, 151644, 151645)
    assert cf.tool_call_end_id == 151658
    assert [cf.encode(t) for t in ("<tool_call>", "<tool_response>", "</tool_response>", "<think>",
                                   "</think>")] == [[151657], [151665], [151666], [151667], [151668]]
    assert (cf.eos_id, cf.pad_id) == (151645, 151643)  # eos <|im_end|>, pad <|endoftext|>
    assert cf.stop_ids == (151643, 151645)
    assert cf.id_count == 151669 and len(cf.tokenizer) == 151669
    # Markup tags are text (kept when special tokens are skipped), control tokens are not.
    ids = cf.encode("<|im_start|>" + THINK_CALL + "<|im_end|>")
    assert cf.tokenizer.decode(ids, skip_special_tokens=True) == THINK_CALL


@pytest.mark.parametrize("case", ["prompt", "prompt_no_system", "agentic_step", "structured_calls"])
def test_render_equals_apply_chat_template_ids(qwen3_chat, case):
    system = {"role": "system", "content": "You are a worker."}
    user = {"role": "user", "content": "Where was the founder of Northwind born?"}
    structured = {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "open", "arguments": {"id": "doc-alice"}}},
        {"type": "function", "function": {"name": "search", "arguments": '{"query": "Lyon"}'}}]}
    messages, generation = {
        "prompt": ([system, user], True),
        "prompt_no_system": ([user], True),
        # Every assistant turn is after the last user query, so the template keeps their think.
        "agentic_step": ([system, user, {"role": "assistant", "content": THINK_CALL},
                          *({"role": "tool", "content": r} for r in RESULTS),
                          {"role": "assistant", "content": THINK_ANSWER}], False),
        "structured_calls": ([system, user, structured,
                              *({"role": "tool", "content": r} for r in RESULTS)], True),
    }[case]
    ids, trainable = qwen3_chat.render(messages, add_generation_prompt=generation, tools=TOOLS)
    assert ids == template_ids(qwen3_chat, messages, tools=TOOLS,
                               add_generation_prompt=generation)
    assert len(trainable) == len(ids)
    text = qwen3_chat.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert '"name": "search"' in text.split("\n</tools>")[0]


def test_template_text_is_tokenised_as_one_string(qwen3_chat):
    """The case piecewise tokenisation gets wrong: a result's last "." and the "\\n" after it."""
    cf = qwen3_chat
    block = cf.tool_response_ids(RESULTS)
    text = cf.decode(block)
    assert text == ("\n<|im_start|>user\n<tool_response>\n" + RESULTS[0] + "\n</tool_response>\n"
                    "<tool_response>\n" + RESULTS[1] + "\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert block == cf.encode(text)
    assert cf.encode("Moreau.\n") != cf.encode("Moreau.") + cf.encode("\n")  # a real merge


def test_qwen3_template_rewrites_history_and_we_do_not(qwen3_chat):
    """After a new user turn (the worker's final-summary instruction) Qwen3's template drops the
    think blocks of earlier assistant turns. Our rollouts keep the ids the model saw."""
    cf = qwen3_chat
    messages = [{"role": "system", "content": "You are a worker."},
                {"role": "user", "content": "Where was Alice born?"},
                {"role": "assistant", "content": THINK_CALL},
                {"role": "tool", "content": RESULTS[1]},
                {"role": "assistant", "content": THINK_ANSWER},
                {"role": "user", "content": prompts.FINAL_SUMMARY_INSTRUCTION}]
    theirs = cf.tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False,
                                              add_generation_prompt=True)
    ours = cf.render_text(messages, add_generation_prompt=True, tools=TOOLS)
    assert "I should search first." not in theirs and "The page says Lyon." not in theirs
    assert theirs.replace("<think>\n", "") != ours
    assert "<|im_start|>assistant\n" + THINK_CALL + "<|im_end|>" in ours
    # Where both keep the think block (the newest user query's step) the ids agree.
    assert (cf.render(messages[:5], tools=TOOLS)[0]
            == template_ids(cf, messages[:5], tools=TOOLS))


def test_rollout_context_grows_by_appending_only(qwen3_chat):
    """Turn k+1's context is turn k's ids plus the appended ones, whatever the model sampled
    (arbitrary ids, which decode -> re-encode would NOT give back) and whether the sampler stopped
    on <|im_end|> or at </tool_call>; the whole equals render() of the text conversation."""
    cf = qwen3_chat
    rng = np.random.default_rng(0)
    system = {"role": "system", "content": cf.system_prompt("You are a worker.", TOOLS)}
    user = {"role": "user", "content": "Where was Alice born?"}
    # " Northwind" spelt letter by letter: ids a model may sample that BPE would never produce.
    spelt = [i for letter in " Northwind" for i in cf.encode(letter)]
    sampled = [list(rng.integers(0, 151643, 12)) + spelt + cf.encode(CALL) + [cf.im_end_id],
               list(rng.integers(0, 151643, 9)) + cf.encode(CALL),  # stopped at </tool_call>
               list(rng.integers(0, 151643, 7)) + [cf.im_end_id],
               cf.encode("Conclusion: Lyon.") + [cf.im_end_id]]
    assert cf.encode(cf.decode(sampled[0])) != sampled[0]  # re-tokenising would change history
    contexts = [cf.prompt_ids([system, user])]

    def extend(*parts):
        context = contexts[-1] + [int(i) for part in parts for i in part]
        assert context[:len(contexts[-1])] == contexts[-1]
        contexts.append(context)

    extend(sampled[0], cf.tool_response_ids(RESULTS))
    extend(sampled[1], cf.tool_response_ids(RESULTS[1], closed=False))
    extend(sampled[2], cf.user_turn_ids(prompts.FINAL_SUMMARY_INSTRUCTION))
    extend(sampled[3], cf.turn_end_ids())
    texts = [cf.decode(s[:-1] if s[-1] == cf.im_end_id else s) for s in sampled]
    messages = [system, user, {"role": "assistant", "content": texts[0]},
                *({"role": "tool", "content": r} for r in RESULTS),
                {"role": "assistant", "content": texts[1]}, {"role": "tool", "content": RESULTS[1]},
                {"role": "assistant", "content": texts[2]},
                {"role": "user", "content": prompts.FINAL_SUMMARY_INSTRUCTION},
                {"role": "assistant", "content": texts[3]}]
    # Same text as a render of the conversation (ids differ only inside sampled turns).
    assert cf.decode(contexts[-1]) == cf.render_text(messages)
    # The system turn (shared by every prompt of a role) is a prefix of every context.
    system_ids = cf.render([system])[0]
    assert contexts[0][:len(system_ids)] == system_ids


def test_missing_tokenizer_is_one_clear_line(tmp_path):
    with pytest.raises(ChatFormatError, match="no tokenizer.json"):
        ChatFormat.from_pretrained(tmp_path)


@pytest.fixture(scope="module")
def qwen3_chat_no_thinking(real_qwen3_tokenizer_dir):
    return ChatFormat.from_pretrained(real_qwen3_tokenizer_dir, enable_thinking=False)


def test_non_thinking_mode_equals_apply_chat_template_with_enable_thinking_false(
        qwen3_chat, qwen3_chat_no_thinking):
    """chat.enable_thinking=False: every generation prompt ends with Qwen3's empty think block,
    as the official template writes it; the default (thinking) is the template's default."""
    cf = qwen3_chat_no_thinking
    system = {"role": "system", "content": "You are a worker."}
    user = {"role": "user", "content": "Where was the founder of Northwind born?"}
    answer = {"role": "assistant", "content": "She was born in \\boxed{Lyon}."}
    assert cf.prompt_ids([system, user], tools=TOOLS) == template_ids(
        cf, [system, user], tools=TOOLS, add_generation_prompt=True, enable_thinking=False)
    assert qwen3_chat.prompt_ids([system, user], tools=TOOLS) == template_ids(
        qwen3_chat, [system, user], tools=TOOLS, add_generation_prompt=True)
    # The answer turn as the template renders the newest one: after an empty think block.
    ids, trainable = cf.render([system, user, answer], tools=TOOLS)
    assert ids == template_ids(cf, [system, user, answer], tools=TOOLS, enable_thinking=False)
    assert cf.decode([i for i, t in zip(ids, trainable) if t]) == answer["content"] + "<|im_end|>"
    # Every later generation prompt (after tool responses, the summary instruction) too.
    empty_think = cf.encode("<think>\n\n</think>\n\n")
    for block in (cf.tool_response_ids(RESULTS), cf.user_turn_ids("Summarise."),
                  cf.assistant_header_ids()):
        assert block[-len(empty_think):] == empty_think
    assert qwen3_chat.tool_response_ids(RESULTS)[-len(empty_think):] != empty_think
    assert qwen3_chat.with_thinking(False).prompt_ids([system, user]) == cf.prompt_ids(
        [system, user])


def test_stop_ids_hold_every_eos_id_of_the_generation_config(real_qwen3_tokenizer_dir, tmp_path):
    """Qwen3's generation_config.json stops at <|im_end|> and <|endoftext|>; any further eos id
    a checkpoint lists stops a turn too, and a broken file is one clear error."""
    import json
    import shutil

    assert ChatFormat.from_pretrained(real_qwen3_tokenizer_dir).stop_ids == (151643, 151645)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(real_qwen3_tokenizer_dir / name, tmp_path / name)
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [151645, 151643, 151662]}))  # <|fim_pad|> as a third eos
    assert ChatFormat.from_pretrained(tmp_path).stop_ids == (151643, 151645, 151662)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "<|im_end|>"}))
    with pytest.raises(ChatFormatError, match="generation_config.json: eos_token_id must be"):
        ChatFormat.from_pretrained(tmp_path)


def test_parallel_tool_calls_split_in_call_order(qwen3_chat):
    """A Qwen3 turn with several calls (the structured_calls layout above) is read as one text
    per call, in order; the think text before them is not a call."""
    from matpo_jax.chat import parse_tool_call, split_tool_calls

    structured = {"role": "assistant", "content": "<think>\nTwo lookups.\n</think>\n\n",
                  "tool_calls": [{"type": "function", "function": {
                      "name": "search", "arguments": {"query": "Lyon"}}},
                      {"type": "function", "function": {"name": "open",
                                                        "arguments": {"id": "doc-alice"}}}]}
    text = qwen3_chat.decode(qwen3_chat.render([structured])[0])
    blocks = split_tool_calls(text)
    assert [(c.name, c.arguments) for c in (parse_tool_call(b, TOOLS) for b in blocks)] == [
        ("search", {"query": "Lyon"}), ("open", {"id": "doc-alice"})]
