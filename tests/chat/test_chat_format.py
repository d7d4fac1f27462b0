"""Tokenizer training, the Qwen3 chat format, tool-call parsing and the role prompts."""
import json
import time

import pytest
from transformers import AutoTokenizer

from matpo_jax.agents import prompts
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA, SUBAGENT_SCHEMA
from matpo_jax.chat import (
    QWEN3_STYLE_CHAT_TEMPLATE,
    ChatFormat,
    ChatFormatError,
    MalformedToolCall,
    ToolCall,
    extract_boxed,
    format_tool_call,
    has_tool_call,
    parse_tool_call,
    strip_think,
)
from matpo_jax.chat.tokenizer_training import QWEN3_SPECIAL_TOKENS, TokenizerTrainingError, train_tokenizer

WORKER_TOOLS = [SEARCH_SCHEMA, OPEN_SCHEMA]
SEARCH_CALL = format_tool_call("search", {"query": "founder of Northwind"})
ANSWER = "<think>The report says Lyon.</think>\n\nShe was born in \\boxed{Lyon}."


def _conversation():
    """A worker-style conversation: tool call, two parallel results, structured tool call, answer."""
    return [
        {"role": "system", "content": "You are a worker."},
        {"role": "user", "content": "Where was the founder of Northwind born?"},
        {"role": "assistant", "content": "<think>Search first.</think>\n\n" + SEARCH_CALL},
        {"role": "tool", "content": "1. Northwind Company (id: doc-northwind)\nIts founder was Alice Moreau."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "open", "arguments": {"id": "doc-alice"}}}]},
        {"role": "tool", "content": "Alice Moreau was born in Lyon."},
        {"role": "tool", "content": "second result"},
        {"role": "assistant", "content": ANSWER},
    ]


# ----------------------------------------------------------------------------- tokenizer training
def test_trained_tokenizer_is_fast_loadable_and_lossless(tmp_path):
    texts = ["Alice was born in Lyon in 1921.", "Bob lives in Oslo."] * 50
    start = time.perf_counter()
    train_tokenizer(texts, vocab_size=320, out_dir=tmp_path)
    assert time.perf_counter() - start < 2.0
    tok = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert len(tok) <= 320
    ids = {t: tok.encode(t, add_special_tokens=False) for t in QWEN3_SPECIAL_TOKENS}
    assert all(len(v) == 1 for v in ids.values()), ids
    assert len({v[0] for v in ids.values()}) == len(QWEN3_SPECIAL_TOKENS)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = "Zürich 日本 \t\n\n  x<tool_call>{\"a\": [1, 2]}</tool_call> 😀"  # unseen bytes too
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text
    # tags are ordinary text to the model (kept when control tokens are skipped), as in Qwen3
    assert tok.decode(tok.encode("<|im_start|><think>a</think>", add_special_tokens=False),
                      skip_special_tokens=True) == "<think>a</think>"
    assert tok.chat_template == QWEN3_STYLE_CHAT_TEMPLATE


def test_frequent_numbers_and_words_become_one_token_each():
    # Whole-number pre-tokens: a year repeated in the corpus is one token, as a name is, so the
    # model copies it from a page in one step; the quoted form of a word is its own token.
    tok = train_tokenizer(["In the year 1965 Kager Labs was founded. (id: \"Kager Labs\")"] * 30,
                          vocab_size=320)
    pieces = lambda text: [tok.decode([i]) for i in tok.encode(text, add_special_tokens=False)]  # noqa: E731
    assert pieces("year 1965.") == ["year", " 1965", "."]  # digit by digit: " ", "1", "9", ...
    assert pieces(" Kager Labs") == [" Kager", " Labs"]
    assert pieces('{"id": "Kager Labs"}')[-4:] == ["Kager", " Labs", '"', '}']


def test_train_tokenizer_learns_merges_and_rejects_tiny_vocab(tmp_path):
    tok = train_tokenizer(["Northwind Northwind Northwind"] * 20, vocab_size=300)
    assert len(tok.encode(" Northwind", add_special_tokens=False)) < len(" Northwind")
    with pytest.raises(TokenizerTrainingError, match="vocab_size"):
        train_tokenizer(["a"], vocab_size=100)


# ----------------------------------------------------------------------------- rendering
def test_render_matches_jinja_template_and_decodes_to_qwen3_text(chat_format):
    messages = _conversation()
    tools = [SEARCH_SCHEMA]
    text = chat_format.render_text(messages, tools=tools)
    assert text == chat_format.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    ids, trainable = chat_format.render(messages, tools=tools)
    assert chat_format.decode(ids) == text
    assert len(ids) == len(trainable)
    # Spot-check the Qwen3 layout itself, not just self-consistency.
    assert text.startswith("<|im_start|>system\nYou are a worker.\n\n# Tools\n\n")
    assert "<tools>\n" + json.dumps(SEARCH_SCHEMA) + "\n</tools>" in text
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' in text
    assert "<|im_start|>user\nWhere was the founder of Northwind born?<|im_end|>\n" in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "open", "arguments": {"id": "doc-alice"}}\n'
            "</tool_call><|im_end|>\n") in text
    assert ("<|im_start|>user\n<tool_response>\nAlice Moreau was born in Lyon.\n</tool_response>\n"
            "<tool_response>\nsecond result\n</tool_response><|im_end|>\n") in text
    assert text.endswith("<|im_start|>assistant\n" + ANSWER + "<|im_end|>\n")


def test_generation_prompt_and_tools_without_system_message(chat_format):
    messages = [{"role": "user", "content": "Hi"}]
    text = chat_format.render_text(messages, add_generation_prompt=True, tools=[SUBAGENT_SCHEMA])
    assert text == chat_format.tokenizer.apply_chat_template(
        messages, tools=[SUBAGENT_SCHEMA], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = chat_format.prompt_ids(messages)
    assert ids[-len(chat_format.assistant_header_ids()):] == chat_format.assistant_header_ids()
    assert chat_format.decode(chat_format.assistant_header_ids()) == "<|im_start|>assistant\n"


def test_system_prompt_embeds_tools_like_qwen3(chat_format):
    text = ChatFormat.system_prompt("Role.", WORKER_TOOLS)
    lines = text.split("\n")
    start = lines.index("<tools>")
    assert [json.loads(line) for line in lines[start + 1 : start + 3]] == WORKER_TOOLS
    assert lines[start + 3] == "</tools>"
    assert ChatFormat.system_prompt("Role.", []) == "Role."
    pre_built = [{"role": "system", "content": text}, {"role": "user", "content": "q"}]
    assert chat_format.render_text(pre_built) == chat_format.render_text(
        [{"role": "system", "content": "Role."}, {"role": "user", "content": "q"}], tools=WORKER_TOOLS)


def test_only_assistant_content_and_its_im_end_are_trainable(chat_format):
    messages = _conversation()
    ids, trainable = chat_format.render(messages)
    spans, current = [], []
    for token, is_trained in zip(ids, trainable):
        if is_trained:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    assert not current  # the newline after the last <|im_end|> is not trained
    expected = [
        "<think>Search first.</think>\n\n" + SEARCH_CALL,
        '<tool_call>\n{"name": "open", "arguments": {"id": "doc-alice"}}\n</tool_call>',
        ANSWER,
    ]
    assert [chat_format.decode(s) for s in spans] == [e + "<|im_end|>" for e in expected]
    assert all(s[-1] == chat_format.im_end_id for s in spans)


def test_render_equals_incremental_rollout_pieces(chat_format):
    """The ids a rollout assembles (prompt, sampled ids, tool/user blocks) equal render()."""
    cf = chat_format
    system = {"role": "system", "content": cf.system_prompt("You are a worker.", WORKER_TOOLS)}
    user = {"role": "user", "content": "Where was Alice born?"}
    call = "<think>look</think>\n" + SEARCH_CALL
    summary_request = prompts.FINAL_SUMMARY_INSTRUCTION
    report = "Conclusion: Lyon. Source: doc-alice."
    results = ["1. Alice Moreau (id: doc-alice)", "2. Lyon (id: doc-lyon)"]

    rendered, trainable = cf.render([
        system, user,
        {"role": "assistant", "content": call},
        *({"role": "tool", "content": r} for r in results),
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "page text"},
        {"role": "assistant", "content": "I found it."},
        {"role": "user", "content": summary_request},
        {"role": "assistant", "content": report},
    ])
    # Sampler stops ON <|im_end|> (closed turns) ...
    incremental = cf.prompt_ids([system, user])
    mask = [False] * len(incremental)

    def sampled(text, close=True):
        ids = cf.encode(text) + ([cf.im_end_id] if close else [])
        mask.extend([True] * len(ids))
        return ids

    def fixed(ids):
        mask.extend([False] * len(ids))
        return ids

    incremental += sampled(call) + fixed(cf.tool_response_ids(results))
    # ... or AT </tool_call>: then tool_response_ids supplies the <|im_end|> (non-trainable).
    incremental += sampled(call, close=False) + fixed(cf.tool_response_ids("page text", closed=False))
    incremental += sampled("I found it.") + fixed(cf.user_turn_ids(summary_request))
    incremental += sampled(report) + fixed(cf.turn_end_ids())
    assert incremental == rendered
    assert cf.encode(call)[-1] == cf.tool_call_end_id
    # Masks agree except the one <|im_end|> the sampler did not produce.
    diff = [i for i, (a, b) in enumerate(zip(mask, trainable)) if a != b]
    assert len(diff) == 1 and rendered[diff[0]] == cf.im_end_id and trainable[diff[0]]


def test_template_runs_tokenise_as_their_pieces_with_a_trained_tokenizer(tmp_path):
    """render() tokenises each run of template text whole (as apply_chat_template does); with a
    tokenizer of ours that equals tokenising every piece on its own, because punctuation never
    merges with the newline after it. So a value at the end of a tool response ends in the same
    "." token as the sentence the model writes about it (Qwen's pre-tokenizer would give ".\n")."""
    # Pages of lines, as the synthetic world's: BPE sees "." before "\n" thousands of times.
    page = "Alice Moreau was born in Lyon.\nAlice Moreau founder Northwind.\n"
    train_tokenizer([page, "Conclusion: Lyon. Source: page Alice Moreau."] * 200, vocab_size=320,
                    out_dir=tmp_path)
    cf = ChatFormat.from_pretrained(tmp_path)
    messages = [
        {"role": "system", "content": cf.system_prompt("You are a worker.", WORKER_TOOLS)},
        {"role": "user", "content": "Where was Alice Moreau born?"},
        {"role": "assistant", "content": SEARCH_CALL},
        {"role": "tool", "content": "1. Alice Moreau (id: doc-alice)."},
        {"role": "tool", "content": page.strip()},  # ends "Northwind." + "\n</tool_response>"
        {"role": "assistant", "content": "Conclusion: Lyon."},
        {"role": "user", "content": "Summarise: what did you find?"},
    ]
    whole, _ = cf.render(messages, add_generation_prompt=True)
    pieces = cf._pieces(messages, True, None)
    assert len(pieces) > len(messages)  # template text between messages is several pieces
    assert whole == [i for piece in pieces for i in cf._piece_ids(piece)]
    assert [cf.decode([i]) for i in cf.encode("Lyon.\n")][-2:] == [".", "\n"]


def test_stop_ids_and_piece_texts(chat_format):
    cf = chat_format
    assert cf.decode([cf.im_end_id]) == "<|im_end|>"
    assert cf.decode([cf.tool_call_end_id]) == "</tool_call>"
    assert cf.decode([cf.endoftext_id]) == cf.decode([cf.pad_id]) == "<|endoftext|>"
    assert cf.eos_id == cf.im_end_id
    assert cf.stop_ids == tuple(sorted({cf.im_end_id, cf.endoftext_id}))
    assert cf.decode(cf.turn_end_ids()) == "\n"
    assert cf.decode(cf.turn_end_ids(closed=False)) == "<|im_end|>\n"
    assert cf.decode(cf.tool_response_ids("r")) == (
        "\n<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert cf.decode(cf.user_turn_ids("Summarise.", closed=False)) == (
        "<|im_end|>\n<|im_start|>user\nSummarise.<|im_end|>\n<|im_start|>assistant\n")


def test_render_rejects_bad_messages_naming_them(chat_format):
    with pytest.raises(ChatFormatError, match=r"messages\[1\]\.role"):
        chat_format.render([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    with pytest.raises(ChatFormatError, match=r"messages\[0\]\.content"):
        chat_format.render([{"role": "user", "content": 3}])


# ----------------------------------------------------------------------------- tool-call parsing
def test_parse_tool_call_valid_and_ignores_think():
    text = '<think>maybe <tool_call>{"name": "bogus"}</tool_call></think>\nOk.\n' + SEARCH_CALL
    assert parse_tool_call(text, WORKER_TOOLS) == ToolCall("search", {"query": "founder of Northwind"})
    call = parse_tool_call('<tool_call>\n{"name": "search", "arguments": {"query": "x", "num": 3}}\n</tool_call>',
                           WORKER_TOOLS)
    assert call.arguments == {"query": "x", "num": 3}
    assert has_tool_call(SEARCH_CALL) and not has_tool_call("<think><tool_call></think> no call")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("just an answer", "no <tool_call>"),
        ('<tool_call>\n{"name": "search", "arguments": {"query": "x"}}', "unterminated"),
        ("<tool_call>\n{name: search}\n</tool_call>", "not valid JSON"),
        ('<tool_call>["search"]</tool_call>', "JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no string 'name'"),
        ('<tool_call>{"name": "subagent", "arguments": {"subtask": "x"}}</tool_call>', "unknown tool 'subagent'"),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "missing required argument(s) ['query']"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x", "page": 2}}</tool_call>', "unexpected argument(s) ['page']"),
        ('<tool_call>{"name": "search", "arguments": {"query": 7}}</tool_call>', "'query' must be string, got integer"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x", "num": true}}</tool_call>', "'num' must be integer, got boolean"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x", "num": 50}}</tool_call>', "'num' must be <= 10"),
        ('<tool_call>{"name": "open", "arguments": "doc-1"}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "open", "arguments": {"id": "a"}, "x": 1}</tool_call>', "unexpected keys"),
        (SEARCH_CALL + "\n" + SEARCH_CALL, "more than one tool call"),
    ],
)
def test_parse_tool_call_errors(text, reason):
    with pytest.raises(MalformedToolCall) as info:
        parse_tool_call(text, WORKER_TOOLS)
    assert reason in info.value.reason


@pytest.mark.parametrize(
    "body, reason",
    [
        ("[" * 1000 + "]" * 1000, "nested too deeply"),
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
        ('{"name": "search", "arguments": {"query": "x", "num": ' + "9" * 5000 + "}}",
         "unreadable value"),
        ('{"name": "search", "arguments": {"query": "\\ud800 x"}}', "invalid Unicode"),
        ('{"name": "search", "arguments": {"query": "x", "num": 1e999}}', "'num' must be integer"),
        ('{"name": "search", "arguments": {"query": "x", "num": NaN}}', "'num' must be integer"),
    ],
    ids=["deep-list", "deep-object", "5000-digits", "lone-surrogate", "infinity", "nan"],
)
def test_hostile_json_is_a_malformed_call_not_a_crash(body, reason):
    # Before: RecursionError / ValueError escaped and ended the rollout as "error".
    with pytest.raises(MalformedToolCall) as info:
        parse_tool_call(f"<tool_call>{body}</tool_call>", WORKER_TOOLS)
    assert reason in info.value.reason and len(info.value.reason) < 200


# ----------------------------------------------------------------------------- answers, think, prompts
@pytest.mark.parametrize(
    "text, answer",
    [
        ("\\boxed{1} then \\boxed{Lyon}", "Lyon"),
        ("x = \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("\\boxed{ Oslo } and an unfinished \\boxed{Kyo", "Oslo"),
        ("no answer here", None),
    ],
)
def test_extract_boxed(text, answer):
    assert extract_boxed(text) == answer


def test_strip_think():
    assert strip_think("<think>a\nb</think>\n\nAnswer") == "Answer"
    assert strip_think("reasoning from a thinking prompt</think>Answer") == "Answer"
    assert strip_think("Answer<think>cut off mid-thought") == "Answer"
    assert strip_think("<think>1</think>A<think>2</think>B") == "AB"


def test_prompts_recap_and_clean_report():
    recap = prompts.worker_recap(" Where was the founder born? ", "Who founded Northwind?")
    assert recap.startswith("The main task is: Where was the founder born?\n")
    assert "Who founded Northwind?" in recap and "report" in recap
    assert prompts.question_prompt("Q?").endswith("\\boxed{}.")
    assert set(prompts.ROLE_TEXT) == {"planner", "worker", "single"}
    planner = prompts.system_prompt("planner")
    assert planner.startswith(prompts.PLANNER_ROLE + "\n\n# Tools")
    assert '"name": "subagent"' in planner and '"name": "search"' not in planner
    worker = prompts.system_prompt("worker")
    assert '"name": "search"' in worker and '"name": "open"' in worker and "subagent" not in worker
    with pytest.raises(ValueError, match="role='judge'"):
        prompts.system_prompt("judge")
    raw = ("<think>long private reasoning</think>\n\nConclusion: Lyon.\n\n\n\nFacts: born there."
           "\n<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call><|im_end|>")
    assert prompts.clean_report(raw, 1000) == "Conclusion: Lyon.\n\nFacts: born there."
    assert prompts.clean_report(raw, 10) == "Conclusion"
    assert prompts.clean_report("<think>only thoughts</think>", 100) == prompts.EMPTY_REPORT
    assert prompts.clean_report("text <tool_call>{unterminated", 100) == "text"
