"""Planner and worker rollouts of one model, sharing one decode batch.

`run_rollouts` starts G planner rollouts per question (or G single agents) and drives them through
the slot sampler (`sampler.run_slots`). Every time some slots stop, the engine reads each stopped
agent's turn, runs the tool calls of all of them at once (thread pool), and answers with the next
tokens to append in place, or frees the slot:
- a planner's `subagent` call spawns a worker with a fresh context (role prompt + user-query recap);
  the planner stops decoding and lends its slot to whoever needs one; once all of its workers
  have reported it decodes on, in place if its cache is still in its slot, else re-prefilled
  into a free one (see scheduler.py);
- a worker runs its own search/open loop, then gets one no-tools final-summary turn; the cleaned,
  truncated summary is the tool response its planner receives;
- single agents call search/open directly.
A turn may make several calls (Qwen3's template invites "one or more"): all of them run at once,
and their answers come back as one user turn with one `<tool_response>` per call, in call order,
as the template renders consecutive tool messages; search/open calls past
`max_tool_calls_per_turn` (subagent calls past `max_worker_calls_per_turn`) get an error text.
A turn ends at `<|im_end|>` or any other eos id of the checkpoint (`ChatFormat.stop_ids`, e.g.
Qwen3's `<|endoftext|>`, after which the template's `<|im_end|>` is written, untrained), and the
embedding rows no token has are never sampled (`Sampling.token_count`).
With `async_tools`, search/open calls run in the background instead: the calling agent gives up
its slot like a waiting planner, and is queued to decode on once its results are in (slow remote
tools then stall only their own agents, not the batch). Every sequence starts from the cached
keys and values of its role's system turn (and, for G > 1, of its question's prompt) when
`reuse_prefixes` is on: those prefixes are computed once per batch.

Token-in, token-out: each `Rollout.tokens` is exactly its slot's KV-cache content. Sampled ids are
appended as trainable with the sampler's log-probs; everything the engine writes (prompts, tool
responses, reports, instructions) is appended as non-trainable. Text is decoded only to parse tool
calls and reports, never re-encoded into a trajectory.

Context budget: a turn is only started when the context, the block injected before it and a full
turn (`max_new_tokens_per_turn`, a worker's `worker_max_new_tokens_per_turn`) fit in
`max_context`; a worker also keeps room for its summary. Workers may sample with settings of
their own (`worker_temperature`, `worker_top_p`, `worker_stop_words`): their slots use the
sampler's profile 1, in the same decode batch as the planners (`sampling_profiles`).
So the cache never overflows mid-turn, and hitting the budget is a recorded `max_context` finish.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import time
from typing import Sequence

from matpo_jax import sampler
from matpo_jax.chat import (ChatFormat, MalformedToolCall, ToolCall, has_tool_call,
                            parse_tool_call, split_tool_calls)
from matpo_jax.agents import prompts
from matpo_jax import tools
from matpo_jax.config.sections import DEFAULT_TOOL_CALLS_PER_TURN, RolloutSection
from matpo_jax.agents.engine_options import EngineOptions
from matpo_jax.agents.progress import EpisodeProgress
from matpo_jax.agents.rollout_metrics import slot_metrics
from matpo_jax.agents.scheduler import PARK, RELEASE, Continue, Decision, SlotScheduler, Turn
from matpo_jax.agents.trajectory import (PLANNER, ROLE_IDS, SINGLE, WORKER, Rollout,
                                         ToolCallRecord)

log = logging.getLogger(__name__)

# Finish reasons (Rollout.finish_reason).
ANSWER = "answer"  # a turn without a tool call
MAX_TURNS = "max_turns"  # the role's turn cap was reached with a tool call pending
MAX_CONTEXT = "max_context"  # the next turn would not fit in max_context
MAX_NEW_TOKENS = "max_new_tokens"  # a turn was cut off by the per-turn token cap
MALFORMED = "malformed_tool_call"  # malformed_tool_call="end_rollout"
ERROR = "error"  # the engine failed on this rollout (logged); the batch goes on
FINISH_REASONS = (ANSWER, MAX_TURNS, MAX_CONTEXT, MAX_NEW_TOKENS, MALFORMED, ERROR)

# The tool schemas in each role's prompt (what its calls are checked against).
# The role id of each sampling profile (sampling_profiles' order: planners or the single agent,
# then workers): the LoRA adapter the sampler applies to a slot of that profile.
PROFILE_ROLES = (ROLE_IDS[PLANNER], ROLE_IDS[WORKER])
_PLANNER_TOOLS = (tools.SUBAGENT_SCHEMA,)
_WORKER_TOOLS = (tools.SEARCH_SCHEMA, tools.OPEN_SCHEMA)


def sampling(cfg: RolloutSection) -> sampler.Sampling:
    """The sampler's settings of a rollout section (the planner's, or the single agent's)."""
    return sampler.Sampling(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                            max_turn_tokens=cfg.max_new_tokens_per_turn)


def worker_sampling(cfg: RolloutSection) -> sampler.Sampling:
    """The workers' sampler settings: the planner's, less what the worker_* fields override."""
    return sampler.Sampling(
        temperature=cfg.temperature if cfg.worker_temperature is None else cfg.worker_temperature,
        top_p=cfg.top_p if cfg.worker_top_p is None else cfg.worker_top_p, top_k=cfg.top_k,
        max_turn_tokens=cfg.worker_turn_tokens)


def stop_word_ids(chat, words, field: str) -> dict[int, int]:
    """Stop ids of configured stop words; each must be exactly one token (the sampler stops on
    token ids)."""
    table = {}
    for word in words:
        ids = chat.encode(word)
        if len(ids) != 1:
            raise ValueError(f"{field}: {word!r} is {len(ids)} tokens {ids}; a stop word must be "
                             "exactly one token of the tokenizer")
        table[int(ids[0])] = sampler.STOP_EOS
    return table


def sampling_profiles(cfg: RolloutSection, chat):
    """(planner sampling, planner stop ids, more_profiles for run_slots). Workers always get
    profile 1, even with the planner's settings: temperatures are operands of the compiled loop
    but the number of profiles is not, so evaluation (greedy, one setting for both roles) then
    runs the loop the rollouts compiled."""
    planner_stops = {**stop_word_ids(chat, cfg.stop_words, "rollout.stop_words"),
                     **_stop_ids(chat)}
    worker_stops = {**stop_word_ids(chat, cfg.worker_stop_words, "rollout.worker_stop_words"),
                    **_stop_ids(chat)}
    # Rows of the embedding past the tokenizer's last id are never drawn.
    planner = sampling(cfg).replace(token_count=chat.id_count)
    worker = worker_sampling(cfg).replace(token_count=chat.id_count)
    return planner, planner_stops, ((worker, worker_stops),)


@dataclasses.dataclass
class RolloutBatch:
    rollouts: list[Rollout]  # sorted by rollout_id: planners / single agents first, then workers
    metrics: dict[str, float]

    def by_role(self, role: str) -> list[Rollout]:
        return [r for r in self.rollouts if r.role == role]

    def children(self, planner: Rollout) -> list[Rollout]:
        by_id = {r.rollout_id: r for r in self.rollouts}
        return [by_id[i] for i in planner.child_ids]


def run_rollouts(model_state, graphdef, chat: ChatFormat, toolbox,
                 questions: Sequence[str], cfg: RolloutSection, rng,
                 options: EngineOptions = EngineOptions(), *,
                 question_offset: int = 0,
                 max_tool_calls_per_turn: int = DEFAULT_TOOL_CALLS_PER_TURN,
                 prefix_rows: int = 0) -> RolloutBatch:
    """Rolls out G samples per question; returns every planner, worker (or single) trajectory.

    cfg: the config's rollout section (evaluation passes a copy with its own group size and
    temperature). toolbox: a `tools.ToolBox` running `search` / `open` (`.call(name, arguments)
    -> ToolResult`, never raising, its text already cut to the context's cap); the engine handles
    `subagent` itself. rng: the sampler's key.
    question_offset: the index of questions[0] in the global batch (a process's share of a
    multi-process batch). Each trajectory samples from its own stream, a function of (global
    question index, sample index, worker ordinal within its planner), so its tokens do not depend
    on which other questions run in this process or which slot it gets (`sampling_stream`).
    max_tool_calls_per_turn: search/open calls one turn may make (`tools.max_calls_per_turn`);
    they all run at once and are answered in call order, the rest get an error text.
    prefix_rows: the sampler's prefix store has at least this many rows (`prefix_rows` of
    run/runtime.py: what the run's training batch registers), so the run's evaluations and
    rollouts share one compiled loop.
    """
    start = time.perf_counter()
    if options.injection_lanes is None and cfg.injection_lanes:  # the options win when set
        options = dataclasses.replace(options, injection_lanes=cfg.injection_lanes)
    tool_counts = _tool_counts(toolbox)
    pool = concurrent.futures.ThreadPoolExecutor(options.tool_threads)
    planner_sampling, planner_stops, more_profiles = sampling_profiles(cfg, chat)
    engine = _Engine(chat, toolbox, cfg, options, pool,
                     max_tool_calls_per_turn=max_tool_calls_per_turn)
    try:
        engine.start(questions, question_offset)
        loop = sampler.run_slots(
            model_state, graphdef, engine.scheduler, slots=cfg.decode_slots,
            max_len=cfg.max_context, max_turn=cfg.turn_buffer, sampling=planner_sampling,
            stop_ids=planner_stops, rng=rng, buckets=options.injection_buckets,
            lanes=options.injection_lanes, prefixes=engine.scheduler.prefixes,
            prefix_rows=prefix_rows, more_profiles=more_profiles,
            # a slot's profile is its role: with LoRA, the role's adapter decodes it
            profile_roles=PROFILE_ROLES,
            prefix_roles=[PROFILE_ROLES[p] for p in engine.scheduler.prefix_profiles],
            paged=(sampler.PagedCache(page_size=cfg.kv_page_size, num_pages=cfg.kv_pages)
                   if cfg.kv_cache == "paged" else None))
    finally:  # calls the engine stopped waiting for are not waited for here either
        pool.shutdown(wait=not engine.counters["tool_timeouts"], cancel_futures=True)
    engine.check_all_finished()
    rollouts = sorted((a.record for a in engine.agents.values()), key=lambda r: r.rollout_id)
    # The decode traffic; the trajectory statistics are rollout_metrics.rollout_stats(rollouts).
    metrics = dict(engine.counters)
    metrics.update(tools.counts_since(tool_counts, _tool_counts(toolbox)))
    metrics.update(slot_metrics(loop, engine.scheduler, cfg, options),
                   wall_time_s=time.perf_counter() - start)
    top_level = sum(r.role != WORKER for r in rollouts)
    metrics["rollouts_per_s"] = top_level / metrics["wall_time_s"]
    return RolloutBatch(rollouts, metrics)


# Worker ordinals a planner's streams leave room for (ordinal 0 is the planner itself).
_STREAMS_PER_SAMPLE = 1024


def sampling_stream(question: int, sample: int, group_size: int, worker: int = 0) -> int:
    """The sampler stream (SlotInjection.stream) of a trajectory: sample `sample` of global
    question `question`, its planner (worker 0) or its worker-th worker (1, 2, ... in spawn order
    within that planner). Distinct per trajectory of a batch; workers past the room wrap (their
    draws would then share keys with a sibling's, never an error)."""
    stream = (question * group_size + sample) * _STREAMS_PER_SAMPLE + worker % _STREAMS_PER_SAMPLE
    if stream >= 2**31:
        raise ValueError(f"question {question} x group size {group_size}: sampling stream "
                         f"{stream} overflows int32 (batch too large)")
    return stream


def _tool_counts(toolbox) -> dict[str, int]:
    """The toolbox's call counters (tools.ToolMetrics), if it keeps them."""
    metrics = getattr(toolbox, "metrics", None)
    return metrics.snapshot() if hasattr(metrics, "snapshot") else {}


def _stop_ids(chat) -> dict[int, int]:
    # Turns end at <|im_end|> (Qwen3 closes a tool-call turn with it too) or at any eos id of the
    # checkpoint (chat.stop_ids: the tokenizer's and generation_config.json's, e.g. Qwen3's
    # <|endoftext|>); not at </tool_call>, so the closing <|im_end|> is sampled, hence trained,
    # as in render().
    table = {int(token): sampler.STOP_EOS for token in chat.stop_ids}
    table[int(chat.im_end_id)] = sampler.STOP_IM_END
    return table


# ================================================================================ the engine


@dataclasses.dataclass
class _Agent:
    """Host-side state of one rollout between its turns."""

    record: Rollout
    tools: Sequence[dict]  # the schemas in this role's prompt (what its calls are checked against)
    question: str  # the planner's question (workers: their planner's)
    stream: int  # its sampler stream (sampling_stream)
    max_turns: int
    budget: int  # context the tool loop may use (a worker keeps room for its summary)
    in_summary: bool = False  # a worker's final-summary turn is running
    responses: list[str | None] = dataclasses.field(default_factory=list)  # awaiting reports
    response_of_worker: dict[int, int] = dataclasses.field(default_factory=dict)
    finished: bool = False


@dataclasses.dataclass
class _Call:
    """One tool call of the turn being handled, and the text that answers it."""

    record: ToolCallRecord
    call: ToolCall | None
    response: str | None = None  # None until known (tool run, or worker report)


@dataclasses.dataclass
class _ToolJobs:
    """The calls of one agent's turn (or of one host call), and those running in the pool."""

    calls: list[_Call]  # all of them (malformed ones already answered)
    running: list[_Call]  # the search/open calls, one future each
    futures: list[concurrent.futures.Future]
    deadline: float  # time.monotonic() past which the engine stops waiting for them


class _Engine:
    def __init__(self, chat, toolbox, cfg: RolloutSection, options: EngineOptions, pool,
                 max_tool_calls_per_turn: int = DEFAULT_TOOL_CALLS_PER_TURN):
        self.chat, self.toolbox, self.cfg, self.options = chat, toolbox, cfg, options
        self.max_tool_calls_per_turn = max_tool_calls_per_turn
        self.pool = pool
        self.agents: dict[int, _Agent] = {}
        self.scheduler = SlotScheduler(cfg.decode_slots, cfg.max_context, self.on_turns,
                                       mix_roles=options.mix_roles, group_order=(PLANNER, WORKER),
                                       on_idle=self._wait_for_tools if cfg.async_tools else None)
        # async_tools: agent id -> its search/open calls in the pool
        self._in_flight: dict[int, _ToolJobs] = {}
        self.counters = collections.Counter(worker_calls_over_limit=0, tool_calls_over_limit=0,
                                            errors=0, tool_timeouts=0)
        self._summary_ids = chat.user_turn_ids(prompts.FINAL_SUMMARY_INSTRUCTION, closed=False)
        self.progress = EpisodeProgress()

    # ----------------------------------------------------------------------- starting rollouts
    def start(self, questions: Sequence[str], question_offset: int = 0) -> None:
        cfg = self.cfg
        role = PLANNER if cfg.mode == "matpo" else SINGLE
        schemas = _PLANNER_TOOLS if role == PLANNER else _WORKER_TOOLS
        if cfg.reuse_prefixes:  # every sequence of a role starts with the role's system turn
            self.scheduler.register_prefix(self._system_ids(role, schemas), self._profile(role))
            if role == PLANNER:
                self.scheduler.register_prefix(self._system_ids(WORKER, _WORKER_TOOLS),
                                               self._profile(WORKER))
        for q, question in enumerate(questions):
            for g in range(cfg.group_size):
                record = Rollout(rollout_id=len(self.agents), role=role, query_index=q,
                                 sample_index=g, parent_id=None)
                stream = sampling_stream(question_offset + q, g, cfg.group_size)
                agent = _Agent(record, schemas, question, stream, cfg.max_turns_planner,
                               cfg.max_context)
                self._open(agent, prompts.question_prompt(question))
                if cfg.reuse_prefixes and cfg.group_size > 1 and g == 0:
                    # the G samples' shared prompt
                    self.scheduler.register_prefix(record.tokens, self._profile(role))

    def _system_message(self, role: str, schemas: Sequence[dict]) -> dict:
        return {"role": "system", "content": self.chat.system_prompt(prompts.ROLE_TEXT[role],
                                                                     schemas)}

    def _system_ids(self, role: str, schemas: Sequence[dict]) -> list[int]:
        """The role's system turn: the start of every prompt of that role."""
        return self.chat.render([self._system_message(role, schemas)])[0]

    def _spawn_worker(self, planner: _Agent, subtask: str, response_index: int) -> None:
        cfg = self.cfg
        parent = planner.record
        record = Rollout(rollout_id=len(self.agents), role=WORKER, query_index=parent.query_index,
                         sample_index=parent.sample_index, parent_id=parent.rollout_id,
                         spawn_turn=parent.num_turns - 1)
        parent.child_ids.append(record.rollout_id)
        planner.response_of_worker[record.rollout_id] = response_index
        budget = cfg.max_context
        if cfg.final_summary:  # keep room for the summary instruction and the summary turn
            budget -= len(self._summary_ids) + cfg.summary_tokens
        # Its ordinal among its planner's workers: fixed by the planner's own trajectory.
        stream = planner.stream + len(parent.child_ids) % _STREAMS_PER_SAMPLE
        agent = _Agent(record, _WORKER_TOOLS, planner.question, stream, cfg.max_turns_worker,
                       budget)
        message = (prompts.worker_recap(planner.question, subtask) if cfg.user_query_recap
                   else subtask)
        self._open(agent, message)

    def _open(self, agent: _Agent, user_message: str) -> None:
        """Writes the agent's prompt and queues it for a slot (or ends it if nothing fits)."""
        record = agent.record
        self.agents[record.rollout_id] = agent
        record.append(self.chat.prompt_ids([self._system_message(record.role, agent.tools),
                                            {"role": "user", "content": user_message}]),
                      trainable=False)
        if self._fits(agent, 0):
            self.scheduler.admit(record.rollout_id, record.tokens, group=record.role,
                                 priority=_priority(record.role), stream=agent.stream,
                                 turn_cap=self._turn_cap(record.role),
                                 profile=self._profile(record.role))
        else:
            self._finish(agent, MAX_CONTEXT)

    # ----------------------------------------------------------------------- the host callback
    def on_turns(self, turns: Sequence[Turn]) -> dict[int, Decision]:
        """Reads every stopped agent's turn, runs all their tool calls at once, answers each.
        With async_tools, the calls run in the background and their agents park instead; agents
        whose calls have come back since the last host call are queued to decode on."""
        if self.cfg.async_tools:
            self._requeue_finished_tools()
        plans: dict[int, list[_Call] | Decision] = {}
        for turn in turns:
            agent = self.agents[turn.seq_id]
            plans[turn.seq_id] = self._guard(agent, self._read_turn, agent, turn)
        decisions: dict[int, Decision] = {}
        if self.cfg.async_tools:
            for seq_id, plan in plans.items():
                if isinstance(plan, list) and _tool_jobs(plan):
                    self._in_flight[seq_id] = self._submit(plan)
                    decisions[seq_id] = PARK
        else:
            self._run_tools([call for plan in plans.values() if isinstance(plan, list)
                             for call in plan])
        for seq_id, plan in plans.items():
            if seq_id in decisions:
                continue
            agent = self.agents[seq_id]
            if isinstance(plan, list):
                plan = self._guard(agent, self._answer_calls, agent, plan)
            decisions[seq_id] = plan
        return decisions

    def _requeue_finished_tools(self) -> None:
        """Answers every parked agent whose tool calls are all back, and queues it to decode on
        (in its slot, if nobody took it meanwhile)."""
        for seq_id, jobs in list(self._in_flight.items()):
            if not (all(f.done() for f in jobs.futures) or time.monotonic() >= jobs.deadline):
                continue
            del self._in_flight[seq_id]
            self._collect(jobs)
            agent = self.agents[seq_id]
            decision = self._guard(agent, self._answer_calls, agent, jobs.calls)
            if isinstance(decision, Continue):  # else the rollout ended: its slot is reclaimed
                self._resume(agent, decision.turn_cap)

    def _wait_for_tools(self) -> bool:
        """No slot has anything to decode: blocks until some tool call is back (async_tools)."""
        if not self._in_flight:
            return False
        first_deadline = min(jobs.deadline for jobs in self._in_flight.values())
        concurrent.futures.wait([f for jobs in self._in_flight.values() for f in jobs.futures],
                                timeout=max(0.0, first_deadline - time.monotonic()),
                                return_when=concurrent.futures.FIRST_COMPLETED)
        self._requeue_finished_tools()
        return True

    def _guard(self, agent: _Agent, method, *args):
        """Runs one agent's step; a failure ends that rollout ("error"), not the whole batch."""
        try:
            return method(*args)
        except Exception:  # noqa: BLE001 - logged and counted; the other rollouts go on
            log.exception("rollout %d failed", agent.record.rollout_id)
            self.counters["errors"] += 1
            if not agent.finished:
                self._finish(agent, ERROR)
            return RELEASE

    def _read_turn(self, agent: _Agent, turn: Turn) -> list[_Call] | Decision:
        """Records the sampled turn; returns its tool calls to run, or what the slot does next."""
        record = agent.record
        record.append(turn.tokens, trainable=True, logprobs=turn.logprobs)
        record.num_turns += 1
        text = self.chat.decode(turn.tokens)
        record.assistant_texts.append(text)
        if agent.in_summary:
            return self._finish(agent, record.finish_reason)
        if turn.stop_reason == sampler.STOP_CACHE_FULL:
            return self._stop(agent, MAX_CONTEXT)
        if turn.stop_reason == sampler.STOP_TURN_CAP:
            return self._stop(agent, MAX_NEW_TOKENS)
        if not has_tool_call(text):
            return self._stop(agent, ANSWER)
        calls = self._parse_calls(agent, text)
        record.tool_calls.extend(c.record for c in calls)
        if (self.cfg.malformed_tool_call == "end_rollout"
                and any(not c.record.valid for c in calls)):
            return self._stop(agent, MALFORMED)
        if record.num_turns >= agent.max_turns:
            return self._stop(agent, MAX_TURNS)
        return calls

    def _parse_calls(self, agent: _Agent, text: str) -> list[_Call]:
        """Every tool call of the turn, each parsed on its own, in the order written (a malformed
        one is answered by its error, the others still run). A planner's subagent calls past
        max_worker_calls_per_turn are refused in _answer_calls; search/open calls past
        max_tool_calls_per_turn here."""
        turn = agent.record.num_turns - 1
        calls, runnable = [], 0
        for block in split_tool_calls(text):
            try:
                call = parse_tool_call(block, agent.tools)
            except MalformedToolCall as malformed:
                calls.append(_Call(ToolCallRecord(turn, None, None, False, malformed.reason), None,
                                   prompts.malformed_call_text(malformed.reason)))
                continue
            record = ToolCallRecord(turn, call.name, call.arguments, True)
            if call.name != "subagent":
                runnable += 1
                if runnable > self.max_tool_calls_per_turn:
                    self.counters["tool_calls_over_limit"] += 1
                    record.error = "not run: too many tool calls in one turn"
                    calls.append(_Call(record, call, (
                        f"Error: at most {self.max_tool_calls_per_turn} tool call(s) per turn; "
                        "this one was not run.")))
                    continue
            calls.append(_Call(record, call))
        return calls

    def _run_tools(self, calls: list[_Call]) -> None:
        """Runs every pending search/open call of this host call concurrently, waiting at most
        `tool_timeout_s` for them."""
        jobs = self._submit(calls)
        concurrent.futures.wait(jobs.futures, timeout=max(0.0, jobs.deadline - time.monotonic()))
        self._collect(jobs)

    def _submit(self, calls: list[_Call]) -> _ToolJobs:
        running = _tool_jobs(calls)
        futures = [self.pool.submit(self._run_tool, c.call) for c in running]
        return _ToolJobs(calls, running, futures, time.monotonic() + self.options.tool_timeout_s)

    def _collect(self, jobs: _ToolJobs) -> None:
        """Answers each call with its result, or with an error text if it is still running (the
        engine's thread writes every answer: a late result cannot change a trajectory)."""
        for call, future in zip(jobs.running, jobs.futures):
            if future.done():
                text, ok = future.result()
            else:
                future.cancel()  # not started yet: never runs
                self.counters["tool_timeouts"] += 1
                text, ok = (f"Error: {call.call.name} failed: no result within "
                            f"{self.options.tool_timeout_s:g} s", False)
            if not ok:
                call.record.tool_failed = True
                call.record.error = text
            call.response = text  # search/open text arrives capped by the toolbox

    def _run_tool(self, call: ToolCall) -> tuple[str, bool]:
        """(text, ok) of one call; runs in the pool, touches no engine state."""
        try:
            result = self.toolbox.call(call.name, call.arguments)
            return result.text, result.ok
        except Exception as exc:  # noqa: BLE001 - ToolBox never raises; a fault all the same
            return f"Error: {call.name} failed: {type(exc).__name__}: {exc}", False

    def _answer_calls(self, agent: _Agent, calls: list[_Call]) -> Decision:
        """After the tools ran: spawn workers for subagent calls, else answer in place."""
        agent.responses = [c.response for c in calls]
        launched = 0
        for index, call in enumerate(calls):
            if call.response is not None:
                continue
            if launched == self.cfg.max_worker_calls_per_turn:
                self.counters["worker_calls_over_limit"] += 1
                call.record.error = "not run: too many subagent calls in one turn"
                agent.responses[index] = (
                    f"Error: at most {self.cfg.max_worker_calls_per_turn} subagent call(s) per "
                    "turn; this one was not run.")
                continue
            launched += 1
            self._spawn_worker(agent, call.call.arguments["subtask"], index)
        if launched:
            # The planner waits; the scheduler lends its slot to others if they need it. It is
            # re-admitted when the last report is in (now, if no worker could even start).
            self._maybe_resume(agent)
            return RELEASE if agent.finished else PARK
        # One user turn, one <tool_response> per call in call order (as Qwen3's template renders
        # consecutive tool messages).
        return self._continue(agent, self.chat.tool_response_ids(agent.responses,
                                                                 closed=self._closed(agent)))

    # ----------------------------------------------------------------------- turn transitions
    def _turn_tokens(self, role: str) -> int:
        """Tokens one turn of the role may sample (rollout.worker_max_new_tokens_per_turn)."""
        return (self.cfg.worker_turn_tokens if role == WORKER
                else self.cfg.max_new_tokens_per_turn)

    def _turn_cap(self, role: str) -> int:
        """The role's turn cap for the sampler (0: the whole turn buffer)."""
        tokens = self._turn_tokens(role)
        return 0 if tokens == self.cfg.turn_buffer else tokens

    def _profile(self, role: str) -> int:
        return 1 if role == WORKER else 0  # sampling_profiles' order

    def _closed(self, agent: _Agent) -> bool:
        """Whether the last sampled turn ended with <|im_end|>; a turn stopped by another eos
        (<|endoftext|>) gets the template's <|im_end|> written after it, non-trainable."""
        tokens = agent.record.tokens
        return bool(tokens) and tokens[-1] == self.chat.im_end_id

    def _fits(self, agent: _Agent, inject_len: int) -> bool:
        if agent.in_summary:
            return len(agent.record.tokens) + inject_len + self.cfg.summary_tokens <= (
                self.cfg.max_context)
        return (len(agent.record.tokens) + inject_len + self._turn_tokens(agent.record.role)
                <= agent.budget)

    def _continue(self, agent: _Agent, ids: list[int]) -> Decision:
        """Appends a non-trainable block in place and lets the agent take another turn."""
        if not self._fits(agent, len(ids)):
            return self._stop(agent, MAX_CONTEXT)
        agent.record.append(ids, trainable=False)
        return Continue(ids, turn_cap=self._turn_cap(agent.record.role))

    def _stop(self, agent: _Agent, reason: str) -> Decision:
        """The agent's tool loop is over. A worker then writes its final summary."""
        record = agent.record
        if record.role == WORKER and self.cfg.final_summary and record.num_turns > 0:
            record.finish_reason = reason
            ids = self.chat.user_turn_ids(prompts.FINAL_SUMMARY_INSTRUCTION,
                                          closed=self._closed(agent))
            agent.in_summary = True
            if self._fits(agent, len(ids)):
                record.append(ids, trainable=False)
                return Continue(ids, turn_cap=self.cfg.summary_tokens)
        return self._finish(agent, reason)

    def _finish(self, agent: _Agent, reason: str) -> Decision:
        """Ends the rollout; a worker hands its report to its planner."""
        record = agent.record
        record.finish_reason = reason
        agent.finished = True
        self.progress.finished(record.role == WORKER, lambda: sum(
            a.record.role != WORKER for a in self.agents.values()))
        if record.role == WORKER:
            last = record.assistant_texts[-1] if record.assistant_texts else ""
            record.report = prompts.clean_report(
                last, self.cfg.report_max_chars,
                keep_reasoning=self.cfg.report_reasoning == "keep")
            planner = self.agents[record.parent_id]
            index = planner.response_of_worker.pop(record.rollout_id, None)
            if index is not None:
                planner.responses[index] = record.report
                self._maybe_resume(planner)
        return RELEASE

    def _maybe_resume(self, planner: _Agent) -> None:
        """Re-admits a planner whose workers have all reported, with their reports appended."""
        if planner.response_of_worker or planner.finished or None in planner.responses:
            return
        ids = self.chat.tool_response_ids(planner.responses, closed=self._closed(planner))
        planner.responses = []
        if not self._fits(planner, len(ids)):
            self._finish(planner, MAX_CONTEXT)
            return
        planner.record.append(ids, trainable=False)
        self._resume(planner)

    def _resume(self, agent: _Agent, turn_cap: int = 0) -> None:
        """Queues a parked agent, its context complete, to decode on (before new sequences)."""
        record = agent.record
        self.scheduler.admit(record.rollout_id, record.tokens, group=record.role,
                             priority=_priority(record.role, resumed=True),
                             turn_cap=turn_cap or self._turn_cap(record.role),
                             stream=agent.stream, profile=self._profile(record.role))

    def check_all_finished(self) -> None:
        stuck = [a.record.rollout_id for a in self.agents.values() if not a.finished]
        if stuck:
            raise RuntimeError(f"the decode loop ended with unfinished rollouts {stuck}")


def _priority(role: str, resumed: bool = False) -> int:
    # Finish what is under way before starting new planners: resumed planners, then workers.
    if resumed:
        return 0
    return 1 if role == WORKER else 2


def _tool_jobs(calls: Sequence[_Call]) -> list[_Call]:
    """The calls a tool must answer (search/open), not yet answered (malformed: by an error)."""
    return [c for c in calls if c.response is None and c.call.name != "subagent"]


__all__ = ["EngineOptions", "RolloutBatch", "run_rollouts", "sampling", "worker_sampling",
           "sampling_profiles", "FINISH_REASONS"]
