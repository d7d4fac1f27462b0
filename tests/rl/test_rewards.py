"""Rewards: answer extraction, matching, the MATPO combination, and the LLM judge over real HTTP."""
import contextlib
import dataclasses
import http.server
import json
import threading
import time

import numpy as np
import pytest

from matpo_jax.agents.trajectory import PLANNER, SINGLE, WORKER, Rollout, ToolCallRecord
from matpo_jax.chat import extract_boxed
from matpo_jax.rl import judge as judge_lib
from matpo_jax.rl import rewards

# The reward stage's settings of the base config (run.runtime.reward_config builds them).
MATPO_EXACT = rewards.RewardConfig(mode="matpo", method="exact", f1_threshold=0.8,
                                   format_credit="always")


# ----------------------------------------------------------------------------- extraction/matching

def test_extract_boxed_takes_last_and_balances_braces():
    assert extract_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert extract_boxed("no answer here") is None
    assert extract_boxed("\\boxed{Paris} and an unclosed \\boxed{Lon") == "Paris"


def _call(valid):
    return ToolCallRecord(turn=0, name="subagent", arguments={}, valid=valid)


def test_answer_comes_only_from_the_planners_own_turns():
    planner = Rollout(0, PLANNER, 0, 0, None,
                      assistant_texts=["\\boxed{Rome}", "final \\boxed{Paris}", "thanks, done"])
    # The worker's report and its own turns contain a (wrong) boxed answer; it must not count.
    worker = Rollout(1, WORKER, 0, 0, 0, assistant_texts=["\\boxed{Berlin}"],
                     report="the answer is \\boxed{Berlin}")
    assert rewards.final_answer(planner) == "Paris"
    out = rewards.rollout_rewards([planner, worker], ["paris"], MATPO_EXACT)
    assert set(out) == {0} and out[0].accuracy == 1.0 and out[0].prediction == "Paris"
    silent = Rollout(2, PLANNER, 0, 1, None, assistant_texts=["I give up"])
    assert rewards.rollout_rewards([silent], ["paris"], MATPO_EXACT)[2].accuracy == 0.0


def test_the_answer_is_read_after_the_thinking():
    """Qwen3 reasons inside <think>...</think> and answers after it: a box written only while
    thinking is no answer (it scores 0), and a box after the last </think> is the answer."""
    thought_only = Rollout(0, PLANNER, 0, 0, None, assistant_texts=[
        "<think>\nMaybe \\boxed{Paris}? Let me check.\n</think>\n\nI could not find it."])
    assert rewards.final_answer(thought_only) is None
    assert rewards.rollout_rewards([thought_only], ["paris"], MATPO_EXACT)[0].accuracy == 0.0
    cut_off = Rollout(1, PLANNER, 0, 1, None, assistant_texts=[
        "<think>\nIt is \\boxed{Paris}, I think"])  # the turn cap hit inside the reasoning
    assert rewards.final_answer(cut_off) is None
    answered = Rollout(2, PLANNER, 0, 2, None, assistant_texts=[
        "<think>\nNot \\boxed{Rome}.\n</think>\n\nIt is \\boxed{Paris}.",
        "<think>\nA last check: \\boxed{Lyon}?\n</think>\n\nDone."])
    assert rewards.final_answer(answered) == "Paris"  # the last turn answered nothing


def test_normalisation_exact_match_and_f1():
    assert rewards.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert rewards.exact_match("the Beatles.", "Beatles")
    assert not rewards.exact_match("Beatles band", "Beatles")
    assert rewards.token_f1("new york city", "new york") == pytest.approx(0.8)
    assert rewards.accuracy("new york city", "new york", "f1", f1_threshold=0.8) == 1.0
    assert rewards.accuracy("new york city", "new york", "f1", f1_threshold=0.9) == 0.0
    assert rewards.accuracy("NYC", ["New York", "nyc"], "exact") == 1.0
    assert rewards.accuracy(None, "x", "exact") == 0.0
    with pytest.raises(ValueError, match="accuracy"):
        rewards.RewardConfig(mode="matpo", method="regex", f1_threshold=0.8,
                             format_credit="always")


# ----------------------------------------------------------------------------- combination

def test_matpo_reward_combination():
    planner = Rollout(0, PLANNER, 0, 0, None, assistant_texts=["\\boxed{x}"],
                      tool_calls=[_call(True), _call(False)])  # planner format 0.5
    w1 = Rollout(1, WORKER, 0, 0, 0, tool_calls=[_call(True)])  # 1.0
    w2 = Rollout(2, WORKER, 0, 0, 0, tool_calls=[_call(True), _call(False), _call(False),
                                                 _call(False)])  # 0.25
    lone = Rollout(3, PLANNER, 0, 1, None, assistant_texts=["\\boxed{y}"])  # no calls: fmt 1.0
    out = rewards.rollout_rewards([planner, w1, w2, lone], ["x"], MATPO_EXACT)
    # 0.9*1 + 0.5*(0.1*0.5 + 0.1*mean(1.0, 0.25))
    assert out[0].reward == pytest.approx(0.9 + 0.5 * (0.05 + 0.0625))
    assert out[0].format_workers == pytest.approx(0.625) and out[0].num_workers == 2
    # No workers: the worker term is 0, not a free 0.1.
    assert out[3].reward == pytest.approx(0.5 * 0.1)
    metrics = rewards.reward_metrics(out)
    assert metrics["reward/accuracy"] == pytest.approx(0.5)


def test_format_credit_when_correct_or_off_leaves_wrong_answers_equal():
    """when_correct: a wrong answer earns nothing for its format, so an all-wrong group has equal
    rewards (no advantage) whatever its tool calls; a right one keeps MATPO's full reward."""
    def group():
        right = Rollout(0, PLANNER, 0, 0, None, assistant_texts=["\\boxed{x}"],
                        tool_calls=[_call(True), _call(False)])
        tidy_wrong = Rollout(1, PLANNER, 0, 1, None, assistant_texts=["\\boxed{y}"],
                             tool_calls=[_call(True)])
        messy_wrong = Rollout(2, PLANNER, 0, 2, None, assistant_texts=["\\boxed{z}"],
                              tool_calls=[_call(False), _call(False)])
        return [right, tidy_wrong, messy_wrong]
    always = rewards.rollout_rewards(group(), ["x"], MATPO_EXACT)
    assert always[1].reward > always[2].reward  # MATPO's rule: format alone separates them
    config = dataclasses.replace(MATPO_EXACT, format_credit="when_correct")
    out = rewards.rollout_rewards(group(), ["x"], config)
    assert out[1].reward == out[2].reward == 0.0
    assert out[0].reward == pytest.approx(always[0].reward) == pytest.approx(0.9 + 0.5 * 0.05)
    off = rewards.rollout_rewards(group(), ["x"],
                                  dataclasses.replace(MATPO_EXACT, format_credit="off"))
    assert [off[i].reward for i in range(3)] == pytest.approx([0.9, 0.0, 0.0])
    with pytest.raises(ValueError, match="format_credit"):
        rewards.RewardConfig(mode="matpo", method="exact", f1_threshold=0.8, format_credit="no")


def test_single_agent_reward_combination():
    agent = Rollout(0, SINGLE, 0, 0, None, assistant_texts=["\\boxed{x}"],
                    tool_calls=[_call(True), _call(True), _call(False), _call(True)])
    single = dataclasses.replace(MATPO_EXACT, mode="single")
    out = rewards.rollout_rewards([agent], ["x"], single)
    assert out[0].reward == pytest.approx(0.9 + 0.1 * 0.75)


# ----------------------------------------------------------------------------- the judge over HTTP

class _ChatServer(http.server.ThreadingHTTPServer):
    """An OpenAI chat-completions endpoint whose behaviour the test scripts per request."""

    daemon_threads = True

    def __init__(self, script):
        super().__init__(("127.0.0.1", 0), _ChatHandler)
        self.script = script  # callable(request_index, body) -> (status, reply text, delay)
        self.requests, self.bodies, self.headers_seen = 0, [], []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()


class _ChatHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            index = server.requests
            server.requests += 1
            server.bodies.append(body)
            server.headers_seen.append(dict(self.headers))
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        try:
            assert self.path == "/v1/chat/completions"
            status, text, delay = server.script(index, body)
            time.sleep(delay)
        finally:
            # Out of flight before the reply is written: the client may send its next request
            # the moment it reads this one, and that must not count as one more in flight.
            with server.lock:
                server.in_flight -= 1
        try:
            payload = (json.dumps({"id": "x", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text},
                 "finish_reason": "stop"}]}) if status == 200 else json.dumps({"error": text}))
            data = payload.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and went away


@contextlib.contextmanager
def chat_server(script):
    server = _ChatServer(script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _judge(server, **overrides):
    settings = dict(base_url=f"http://127.0.0.1:{server.server_port}/v1", model="judge-test",
                    api_key_env="MATPO_TEST_JUDGE_KEY", timeout_s=2.0, max_retries=2,
                    backoff_s=0.01)
    config = judge_lib.JudgeConfig(**{**settings, **overrides})
    return judge_lib.LLMJudge(config)


def _grade_by_gold_in_prompt(index, body):
    prompt = body["messages"][0]["content"]
    gold = prompt.split("<gold_answer>")[1].split("</gold_answer>")[0]
    pred = prompt.split("<predicted_answer>")[1].split("</predicted_answer>")[0]
    return 200, ("A" if gold.lower() == pred.lower() else "B"), 0.0


def test_judge_speaks_the_chat_completions_protocol(monkeypatch):
    monkeypatch.setenv("MATPO_TEST_JUDGE_KEY", "sk-test")
    with chat_server(_grade_by_gold_in_prompt) as server:
        judge = _judge(server)
        assert judge.grade("Capital of France?", "Paris", "paris") == judge_lib.CORRECT
        assert not judge.is_correct("Capital of France?", "Paris", "Lyon")
    body = server.bodies[0]
    assert body["model"] == "judge-test" and body["messages"][0]["role"] == "user"
    assert "Capital of France?" in body["messages"][0]["content"]
    assert server.headers_seen[0]["Authorization"] == "Bearer sk-test"


def test_judge_retries_a_server_error_then_succeeds():
    script = lambda i, body: (500, "overloaded", 0.0) if i == 0 else (200, "A", 0.0)  # noqa: E731
    with chat_server(script) as server:
        judge = _judge(server)
        assert judge.grade("q", "g", "g") == "A"
    assert server.requests == 2 and judge.stats.retries == 1


def test_judge_times_out_then_retries():
    script = lambda i, body: (200, "A", 1.5 if i == 0 else 0.0)  # noqa: E731
    with chat_server(script) as server:
        judge = _judge(server, timeout_s=0.3)
        start = time.monotonic()
        assert judge.grade("q", "g", "g") == "A"
        assert time.monotonic() - start < 1.4  # the slow first reply was not waited for
    assert judge.stats.retries == 1


def test_judge_gives_up_after_retries_and_grade_many_survives():
    with chat_server(lambda i, body: (503, "down", 0.0)) as server:
        judge = _judge(server, max_retries=1)
        with pytest.raises(judge_lib.JudgeError, match="2 attempts"):
            judge.grade("q", "g", "p")
        assert judge.grade_many([("q", "g", "p")]) == [None]
    assert judge.stats.failures == 1
    with chat_server(lambda i, body: (400, "bad request", 0.0)) as server:
        with pytest.raises(judge_lib.JudgeError, match="HTTP 400"):
            _judge(server).grade("q", "g", "p")
        assert server.requests == 1  # a client error is not retried


def test_judge_caps_concurrency_and_parses_letters():
    with chat_server(lambda i, body: (200, "B", 0.15)) as server:
        judge = _judge(server, max_concurrency=2)
        assert judge.grade_many([("q", "g", "p")] * 6) == ["B"] * 6
    assert server.max_in_flight == 2
    assert judge_lib.parse_grade("  C\n") == "C"
    assert judge_lib.parse_grade("Grade: A") == "A"
    with pytest.raises(judge_lib.JudgeError):
        judge_lib.parse_grade("correct")


def test_rollout_rewards_with_the_judge(rollout_batch):
    rollouts, golds = rollout_batch(seed=3, queries=2, group=3)
    questions = [f"question {q}" for q in range(len(golds))]
    with chat_server(_grade_by_gold_in_prompt) as server:
        judged = dataclasses.replace(MATPO_EXACT, method="judge")
        by_judge = rewards.rollout_rewards(rollouts, golds, judged, questions=questions,
                                           judge=_judge(server))
    by_match = rewards.rollout_rewards(rollouts, golds, MATPO_EXACT)
    assert by_judge.keys() == by_match.keys()
    for rid in by_match:
        assert by_judge[rid].accuracy == by_match[rid].accuracy
        assert by_judge[rid].reward == pytest.approx(by_match[rid].reward)
    assert 0 < np.mean([b.accuracy for b in by_match.values()]) < 1  # both outcomes exercised
