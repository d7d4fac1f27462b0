"""Every field of an experiment, declared once: one frozen dataclass per section, each consumed by
its stage (the rollout engine reads `RolloutSection`, the tool clients `ToolsSection`, ...).

The ml_collections ConfigDict that config files edit (`base_config()`), the command-line overrides
and the validation are all derived from these declarations (see configdict.py, validation.py).
A section object is valid by construction: its fields are checked against their declared type,
range and choices, and its own cross-field rules, in `__post_init__`.
"""
from __future__ import annotations

import dataclasses

from matpo_jax.config.errors import ConfigError
from matpo_jax.config.fields import (AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, SEED, UNIT, Interval,
                                     Section, group, setting)

DTYPES = ("float32", "bfloat16")
MODEL_FAMILIES = ("qwen3", "llama", "qwen2")  # model/config.py's FAMILIES; a test keeps them equal
# model/config.py's ATTENTION_KERNELS (per path); a test keeps them equal.
ATTENTION_TRAIN = ("auto", "xla", "splash", "cudnn", "pallas_gpu")
ATTENTION_EXTEND = ("auto", "xla", "paged_tpu")
ATTENTION_DECODE = ("auto", "xla", "paged_tpu", "paged_gpu")
DATASETS = ("synthetic_multihop", "musique", "frames", "webwalkerqa", "gaia")
# The splits of the published datasets' builders (data/musique.py, ...; a test keeps them equal).
PUBLISHED_SPLITS = {"musique": ("train", "validation"), "frames": ("test",),
                    "webwalkerqa": ("main", "silver"), "gaia": ("validation",)}
ROLLOUT_MODES = ("matpo", "single")
OPTIMIZERS = ("adamw", "sgd")  # trainer/step.py's; a test keeps them equal
FORMAT_CREDITS = ("always", "when_correct", "off")  # rl/rewards.py reads these
RATIOS = ("token", "setwise")  # trainer/loss.py's; a test keeps them equal
ROLLOUT_CORRECTIONS = ("off", "measure", "tis")  # trainer/loss.py's; a test keeps them equal
# model/lora.py's TARGETS and ROLE_MODES (this module imports no jax; a test keeps them equal).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_ROLES = ("shared", "per_role")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                     "seq-mean-token-sum-norm", "matpo")


# Search/open calls one assistant turn may make (tools.max_calls_per_turn's default).
DEFAULT_TOOL_CALLS_PER_TURN = 4

# ------------------------------------------------------------------------------------------ model
@dataclasses.dataclass(frozen=True)
class ArchSection(Section):
    """Dimensions of a model trained from scratch (names match model.config.DecoderConfig)."""

    PATH = "model.arch"
    family: str = setting("qwen3", "decoder family: q/k norm (qwen3), q/k/v biases (qwen2), "
                          "neither (llama)", choices=MODEL_FAMILIES)
    vocab_size: int = setting(2048, "tokenizer and embedding size", range=AT_LEAST_ONE)
    hidden_size: int = setting(64, "model width", range=AT_LEAST_ONE)
    intermediate_size: int = setting(192, "MLP hidden units", range=AT_LEAST_ONE)
    num_hidden_layers: int = setting(2, "decoder layers", range=AT_LEAST_ONE)
    num_attention_heads: int = setting(4, "query heads", range=AT_LEAST_ONE)
    num_key_value_heads: int = setting(2, "key/value heads (grouped-query attention)",
                                       range=AT_LEAST_ONE)
    head_dim: int = setting(16, "width of one head", range=AT_LEAST_ONE)
    rope_theta: float = setting(1e6, "rotary embedding base", range=POSITIVE)
    rms_norm_eps: float = setting(1e-6, "RMSNorm epsilon", range=POSITIVE)
    tie_word_embeddings: bool = setting(True, "lm head shares the embedding matrix")
    max_position_embeddings: int = setting(4096, "longest position the model is built for",
                                           range=AT_LEAST_ONE)

    def consistency_problems(self) -> list[str]:
        problems = []
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"model.arch.num_attention_heads = {self.num_attention_heads}: must be "
                            f"a multiple of model.arch.num_key_value_heads = "
                            f"{self.num_key_value_heads}")
        if self.head_dim % 2:
            problems.append(f"model.arch.head_dim = {self.head_dim}: must be even (rotary "
                            f"embeddings rotate pairs)")
        return problems


@dataclasses.dataclass(frozen=True)
class AttentionSection(Section):
    """Which attention implementation each path runs (docs/attention_kernels.md). auto: by
    backend (CPU: xla, the reference; TPU: splash for training; GPU: cudnn for training). A
    kernel that cannot express a masking rule falls back to xla and logs why."""

    PATH = "model.attention"
    train: str = setting("auto", "packed training rows (segments, causal, shared prompts)",
                         choices=ATTENTION_TRAIN)
    extend: str = setting("auto", "multi-token extend / prefill over the KV cache (paged_tpu: "
                          "the Pallas kernel over rollout.kv_cache=paged)",
                          choices=ATTENTION_EXTEND)
    decode: str = setting("auto", "one-token decode steps over the KV cache (paged_tpu, "
                          "paged_gpu: the Pallas kernels over rollout.kv_cache=paged; with the "
                          "dense cache they run xla and log so)", choices=ATTENTION_DECODE)


@dataclasses.dataclass(frozen=True)
class LoRASection(Section):
    """Low-rank adapters over a frozen base (model/lora.py, docs/lora.md); rank 0: off, every
    parameter trained (full fine-tuning, the default)."""

    PATH = "model.lora"
    rank: int = setting(0, "adapter rank r (0: no adapters, full fine-tuning)", range=NON_NEGATIVE)
    alpha: float = setting(16.0, "adapter scale numerator: the update is (alpha / r) x A B",
                           range=POSITIVE)
    targets: tuple[str, ...] = setting(LORA_TARGETS, "projections that get adapters",
                                       choices=LORA_TARGETS)
    roles: str = setting("shared", "one adapter for every role, or one per role (planner, "
                         "worker) in the same batches", choices=LORA_ROLES)
    base_dtype: str | None = setting(None, "dtype the frozen base is stored in (None: "
                                     "model.param_dtype); bfloat16 halves a float32 base",
                                     choices=DTYPES)

    def consistency_problems(self) -> list[str]:
        if self.rank and not self.targets:
            return ["model.lora.targets: empty with model.lora.rank > 0 (name at least one "
                    "projection)"]
        return []


@dataclasses.dataclass(frozen=True)
class ModelSection(Section):
    """The decoder (Qwen3, Llama or Qwen2 family). With `hf_checkpoint` set, its config.json wins
    over `arch`."""

    PATH = "model"
    hf_checkpoint: str | None = setting(None, "directory with config.json + *.safetensors")
    # A committed warm start (warm_starts/) is loaded only if its weights are the bytes it was
    # published with.
    hf_checkpoint_sha256: str = setting("", "sha256 of hf_checkpoint's model.safetensors; a "
                                        "file that differs is refused ('': not checked)")
    tokenizer: str | None = setting(None, "HF tokenizer dir; None: hf_checkpoint's or the world's "
                                    "trained one")
    dtype: str = setting("float32", "activations", choices=DTYPES)
    param_dtype: str = setting("float32", "parameters and optimizer state", choices=DTYPES)
    arch: ArchSection = group(ArchSection, "dimensions of a model built from scratch")
    attention: AttentionSection = group(AttentionSection, "attention implementation per path")
    lora: LoRASection = group(LoRASection, "low-rank adapters over the frozen model (rank 0: off)")


# ------------------------------------------------------------------------------------------- mesh
@dataclasses.dataclass(frozen=True)
class MeshSection(Section):
    """Device mesh; one axis may be -1 to take the remaining devices. Batch: over data*fsdp."""

    PATH = "mesh"
    data: int = setting(1, "pure data parallelism (-1: the remaining devices)")
    fsdp: int = setting(-1, "data parallelism with sharded parameters (-1: the rest)")
    tensor: int = setting(1, "heads / MLP units split over chips (-1: the rest)")

    def axes(self) -> dict[str, int]:
        return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}

    def consistency_problems(self) -> list[str]:
        axes = self.axes()
        problems = [f"mesh.{axis} = {size}: must be >= 1 or -1 (the rest)"
                    for axis, size in axes.items() if size != -1 and size < 1]
        if not problems and list(axes.values()).count(-1) > 1:
            problems.append(f"mesh: at most one axis may be -1, got {axes}")
        return problems


# ------------------------------------------------------------------------------------------- data
@dataclasses.dataclass(frozen=True)
class DataSection(Section):
    PATH = "data"
    name: str = setting("synthetic_multihop", "the training dataset", choices=DATASETS)
    split: str = setting("train", "the split RL questions are drawn from")
    data_dir: str | None = setting(None, "TFDS data_dir; None: <workdir>/tfds")
    manual_dir: str | None = setting(None, "downloaded MuSiQue/FRAMES/... files")
    batch_size: int = setting(4, "questions per RL step (each sampled group_size times)",
                              range=AT_LEAST_ONE)
    shuffle_seed: int = setting(0, "order of the RL question stream", range=SEED)
    world_seed: int = setting(0, "synthetic world: which world to generate", range=SEED)
    fact_style: str = setting("varied", "synthetic world: 'plain' states every fact one way "
                              "(easier)", choices=("varied", "plain"))
    noise: float = setting(0.3, "synthetic world: share of distractor sentences/near-duplicates "
                           "per page", range=UNIT)
    num_entities: int = setting(300, "synthetic world size (entities; pages follow)",
                                range=AT_LEAST_ONE)
    num_questions: int = setting(4000, "synthetic questions over all splits and hop counts",
                                 range=AT_LEAST_ONE)
    max_hops: int = setting(4, "synthetic questions have 1..max_hops hops", range=AT_LEAST_ONE)
    # > 0 gives SFT demonstrations their own entities (an `sft` split taken from train), so RL
    # rewards come from reading, never from facts SFT made the model memorise.
    sft_fraction: float = setting(0.0, "synthetic world: share of entities for SFT only (of the "
                                  "0.7 train share)", range=Interval(ge=0, lt=0.7))
    # Their answers were never SFT targets (entities are shared, so facts seen in SFT contexts can
    # still be recalled).
    rl_skips_demonstrated: bool = setting(False, "RL draws only train questions SFT did not "
                                          "demonstrate")
    # > 0: every word of a held-out entity's name also occurs in train names (a new combination,
    # not a new token a small model never learned to emit); 0 draws fresh words per name.
    name_words: int = setting(0, "synthetic world: names from a lexicon of that many pseudo-words",
                              range=NON_NEGATIVE)


# ---------------------------------------------------------------------------------------- rollout
@dataclasses.dataclass(frozen=True)
class RolloutSection(Section):
    """What the rollout engine (agents/rollout.py) runs: roles, group, sampling, budgets."""

    PATH = "rollout"
    mode: str = setting("matpo", "matpo: planner + workers; single: one agent with the tools",
                        choices=ROLLOUT_MODES)
    group_size: int = setting(4, "G samples per question (the GRPO group)", range=AT_LEAST_ONE)
    temperature: float = setting(1.0, "sampling temperature (0: greedy)", range=NON_NEGATIVE)
    top_p: float = setting(1.0, "nucleus sampling mass", range=Interval(gt=0, le=1))
    top_k: int = setting(0, "top-k sampling (0: off)", range=NON_NEGATIVE)
    max_turns_planner: int = setting(6, "assistant turns of a planner (and of a single agent)",
                                     range=AT_LEAST_ONE)
    max_turns_worker: int = setting(6, "tool-loop turns of a worker (its final summary on top)",
                                    range=AT_LEAST_ONE)
    max_context: int = setting(2048, "tokens per rollout (prompt + everything after it)",
                               range=AT_LEAST_ONE)
    max_new_tokens_per_turn: int = setting(256, "tokens of one assistant turn", range=AT_LEAST_ONE)
    max_worker_calls_per_turn: int = setting(1, "subagent calls one planner turn may make (the "
                                             "rest get an error)", range=AT_LEAST_ONE)
    decode_slots: int = setting(32, "concurrent sequences in the decode batch", range=AT_LEAST_ONE)
    # A host call writing into n slots runs ceil(n / lanes) extends of `lanes` rows, each as wide
    # as its longest write. Few lanes: fewer padded positions; many: fewer passes over the
    # weights. A tiny model pays per position (docs/findings.md 0s: 1 lane, 1.4x faster rollouts
    # in the demo, the same tokens); a large one per pass.
    injection_lanes: int = setting(0, "rows one injection extend writes together (0: an eighth "
                                   "of decode_slots)", range=NON_NEGATIVE)
    # Paged: the cache's memory follows the tokens in flight and prefixes are shared by page
    # (model/paged_cache.py, docs/attention_kernels.md); on a TPU its decode steps can run the
    # paged kernel (model.attention.decode). The same tokens as dense, greedy.
    kv_cache: str = setting("dense", "the decode batch's KV cache: dense (decode_slots x "
                            "max_context) or paged (on a mesh: kv heads over tensor, a pool "
                            "per data x fsdp shard)", choices=("dense", "paged"))
    kv_page_size: int = setting(64, "tokens per page of a paged KV cache (max_context must be a "
                                "multiple)", range=AT_LEAST_ONE)
    kv_pages: int = setting(0, "pages in a paged KV cache's pools, all batch shards together "
                            "(a multiple of data x fsdp; 0: room for every slot and prompt prefix "
                            "at max_context)", range=NON_NEGATIVE)
    # Off: prefill every prompt in full.
    reuse_prefixes: bool = setting(True, "compute each role's system turn (and each question's "
                                   "prompt, shared by its G samples) once per batch")
    # For remote tools with real latency; with the local search server (~1 ms a call) waiting is
    # cheaper than the extra re-admissions. On, an agent resumes at whichever host call finds its
    # results back, so slots, evictions and re-prefills follow the tools' timing: reruns of a seed
    # are then not bitwise identical (off, they are: tests/run/test_determinism.py).
    async_tools: bool = setting(False, "tool calls run in the background while the batch decodes "
                                "on (their agents give up their slots)")
    report_max_chars: int = setting(1000, "worker report handed to the planner is cut here",
                                    range=AT_LEAST_ONE)
    # MATPO's reference release hands the planner the worker's answer without its reasoning;
    # "keep" leaves the reasoning's text in (its <think> tags removed), for comparison.
    report_reasoning: str = setting("strip", "the worker's reasoning in the report the planner "
                                    "reads: strip it, or keep its text",
                                    choices=("strip", "keep"))
    final_summary: bool = setting(True, "give a stopped worker one no-tools turn to write its "
                                  "report")
    final_summary_max_tokens: int = setting(256, "tokens of that turn (at most "
                                            "max_new_tokens_per_turn: the turn buffer)",
                                            range=AT_LEAST_ONE)
    user_query_recap: bool = setting(True, "the worker also sees the planner's question")
    malformed_tool_call: str = setting("error_message", "error_message: the model reads an error; "
                                       "end_rollout: the reference behaviour",
                                       choices=("error_message", "end_rollout"))
    # Per-role sampling (docs/METHOD.md section 2.10): workers decode in the planners' batch with
    # settings of their own. None: the planner's (the fields above).
    worker_temperature: float | None = setting(None, "workers' sampling temperature (0: greedy; "
                                               "None: rollout.temperature)", range=NON_NEGATIVE)
    worker_top_p: float | None = setting(None, "workers' nucleus mass (None: rollout.top_p)",
                                         range=Interval(gt=0, le=1))
    worker_max_new_tokens_per_turn: int | None = setting(
        None, "tokens of one worker turn (None: rollout.max_new_tokens_per_turn)",
        range=AT_LEAST_ONE)
    # Each must be one token of the tokenizer; a turn ends after sampling it, as at eos.
    stop_words: tuple[str, ...] = setting((), "extra texts that end a planner's (or single "
                                          "agent's) turn, besides <|im_end|> and eos")
    worker_stop_words: tuple[str, ...] = setting((), "extra texts that end a worker's turn")

    @property
    def worker_turn_tokens(self) -> int:
        """Tokens of one worker turn."""
        return self.worker_max_new_tokens_per_turn or self.max_new_tokens_per_turn

    @property
    def turn_buffer(self) -> int:
        """The sampler's turn buffer: the longer of the two roles' turns."""
        return max(self.max_new_tokens_per_turn, self.worker_turn_tokens)

    @property
    def summary_tokens(self) -> int:
        """Tokens a worker's final-summary turn may sample (never past the turn buffer)."""
        return min(self.final_summary_max_tokens, self.turn_buffer)

    def consistency_problems(self) -> list[str]:
        problems = []
        for name in ("max_new_tokens_per_turn", "worker_max_new_tokens_per_turn"):
            value = getattr(self, name)
            if value is not None and value >= self.max_context:
                problems.append(f"rollout.{name} = {value}: must be < rollout.max_context = "
                                f"{self.max_context}")
        if self.kv_cache == "paged" and self.max_context % self.kv_page_size:
            problems.append(f"rollout.max_context = {self.max_context}: must be a multiple of "
                            f"rollout.kv_page_size = {self.kv_page_size} with "
                            f"rollout.kv_cache = paged")
        return problems


# ------------------------------------------------------------------------------------------- chat
@dataclasses.dataclass(frozen=True)
class ChatSection(Section):
    """How prompts are written for the model (chat/format.py ChatFormat)."""

    PATH = "chat"
    # Qwen3's template default. Off, every generation prompt ends with an empty think block
    # (`<think>\n\n</think>\n\n`), Qwen3's non-thinking mode: the model answers without reasoning
    # (shorter turns), as `apply_chat_template(..., enable_thinking=False)` asks it to.
    enable_thinking: bool = setting(True, "the model may reason in <think> before each turn; "
                                    "False: Qwen3's non-thinking mode (an empty think block after "
                                    "every generation prompt)")


# ------------------------------------------------------------------------------------------ tools
@dataclasses.dataclass(frozen=True)
class ToolsSection(Section):
    """The workers' search and open tools (tools/clients.py, built by run.runtime.make_toolbox)."""

    PATH = "tools"
    search_backend: str = setting("local", "local: our BM25 server over the world's corpus; "
                                  "serper / retrieval: a remote service at search_url",
                                  choices=("local", "serper", "retrieval"))
    search_url: str | None = setting(None, "serper / retrieval endpoint; local: started by us")
    page_url: str | None = setting(None, "page service endpoint (ids of the local corpus); None: "
                                   "search_url's service")
    page_backend: str = setting("service", "how `open` reads a page: service (page_url, offline "
                                "worlds), fetch (the URL, main text by trafilatura), reader "
                                "(a Jina-style reader at reader_url), serper_scrape",
                                choices=("service", "fetch", "reader", "serper_scrape"))
    reader_url: str | None = setting(None, "reader service of page_backend reader / serper_scrape")
    reader_key_env: str | None = setting(None, "env var holding the reader's key (serper_scrape: "
                                         "api_key_env)")
    cache_dir: str | None = setting(None, "disk cache of tool results (reruns and resumes never "
                                    "pay twice); None: no cache")
    api_key_env: str = setting("SERPER_API_KEY", "env var holding the serper API key (never the "
                               "key itself)")
    num_results: int = setting(5, "search hits per call when the model does not ask for a number",
                               range=AT_LEAST_ONE)
    timeout_s: float = setting(30.0, "per socket read of a tool call", range=POSITIVE)
    deadline_s: float = setting(60.0, "a whole tool call: every attempt, redirect and byte",
                                range=POSITIVE)
    retries: int = setting(2, "extra attempts after the first", range=NON_NEGATIVE)
    max_response_chars: int = setting(2000, "tool output is cut here before entering the context",
                                      range=AT_LEAST_ONE)
    # Qwen3 emits parallel calls ("You may call one or more functions"): they run at once, each
    # answered by its own <tool_response> of one user turn, in call order.
    max_calls_per_turn: int = setting(DEFAULT_TOOL_CALLS_PER_TURN, "search/open calls one turn "
                                      "may make; the rest get an error text",
                                      range=AT_LEAST_ONE)


# ----------------------------------------------------------------------------------------- reward
@dataclasses.dataclass(frozen=True)
class RewardSection(Section):
    """Accuracy (exact match, token F1 >= threshold, or an LLM judge) + tool-call format reward."""

    PATH = "reward"
    method: str = setting("exact", "how an answer is graded", choices=("exact", "f1", "judge"))
    f1_threshold: float = setting(0.8, "f1: token F1 that counts as correct", range=UNIT)
    format_credit: str = setting("always", "when the tool-call format term counts: always "
                                 "(MATPO), when_correct (only with a right answer), off",
                                 choices=FORMAT_CREDITS)
    judge_url: str | None = setting(None, "OpenAI-compatible base URL, ends before /chat/...")
    judge_model: str = setting("gpt-4o-mini", "the judge's model name")
    judge_api_key_env: str = setting("OPENAI_API_KEY", "env var holding the judge's API key")
    judge_timeout_s: float = setting(30.0, "the whole of one judge request: connecting, headers "
                                     "and body (not per read)", range=POSITIVE)
    judge_max_retries: int = setting(3, "extra judge attempts after the first, on transient "
                                     "failures", range=NON_NEGATIVE)


# ------------------------------------------------------------------------------------------ rl
@dataclasses.dataclass(frozen=True)
class RLSection(Section):
    """The RL update: optimizer, clipped surrogate, loss aggregation, advantages, packing."""

    PATH = "rl"
    optimizer: str = setting("adamw", "adamw, or sgd (update = lr x gradient: what exactness "
                             "tests across topologies compare)", choices=OPTIMIZERS)
    lr: float = setting(1e-5, "peak learning rate", range=POSITIVE)
    weight_decay: float = setting(0.01, "AdamW decay on matrices (also SFT's)", range=NON_NEGATIVE)
    grad_clip: float = setting(1.0, "global-norm clip (also SFT's); 0: off", range=NON_NEGATIVE)
    schedule: str = setting("constant", "lr after warmup: constant, or cosine / linear decay to 0 "
                            "at train.steps", choices=("constant", "cosine", "linear"))
    warmup_steps: int = setting(0, "optimizer steps of linear warmup", range=NON_NEGATIVE)
    adam_b1: float = setting(0.9, "Adam first-moment decay", range=Interval(ge=0, lt=1))
    adam_b2: float = setting(0.999, "Adam second-moment decay", range=Interval(ge=0, lt=1))
    eps_low: float = setting(0.2, "ratio clip range [1 - eps_low, 1 + eps_high]",
                             range=Interval(ge=0, lt=1))  # 1 - eps_low must stay positive
    eps_high: float = setting(0.2, "upper ratio clip", range=NON_NEGATIVE)
    dual_clip_c: float = setting(3.0, "bound on the loss of negative-advantage tokens (> 1)",
                                 range=Interval(gt=1))  # c <= 1 would clip below the ordinary clip
    loss_agg: str = setting("token-mean", "how token losses are averaged",
                            choices=LOSS_AGGREGATIONS)
    ratio: str = setting("token", "token: one ratio and clip per token (PPO); setwise (SRPO): "
                         "one per planner turn with the workers it spawned", choices=RATIOS)
    rollout_correction: str = setting(
        "off", "sampler vs train-step numerics (METHOD 5.2): off; measure (recompute the sampled "
        "tokens' log-probs, one more forward pass, and log mismatch/*); tis (also: the ratio "
        "against them, each token weighted by min(pi_step / pi_sampler, rl.tis_cap))",
        choices=ROLLOUT_CORRECTIONS)
    tis_cap: float = setting(2.0, "rl.rollout_correction=tis: the largest importance weight",
                             range=Interval(ge=1))
    seq_mean_denominator: str = setting("sequences", "seq-mean modes: divide by sequences, or by "
                                        "planners (the reference release)",
                                        choices=("sequences", "planners"))
    loss_agg_norm: float = setting(0.0, "seq-mean-token-sum-norm divisor; 0: padded row length",
                                   range=NON_NEGATIVE)
    norm_by_std: bool = setting(True, "GRPO advantages (r - mean) / std; False: Dr.GRPO r - mean")
    group_by: str = setting("planner", "planner: workers share their planner's advantage (MATPO); "
                            "role: workers grouped per worker rollout (AT-GRPO-style); agent: "
                            "per-agent normalisation, each delegating planner once (Dr. MAS)",
                            choices=("planner", "role", "agent"))
    kl_coef: float = setting(0.0, "KL penalty to the reference policy (the RL start, frozen)",
                             range=NON_NEGATIVE)
    kl_type: str = setting("low_var_kl", "KL estimator", choices=("k1", "low_var_kl"))
    entropy_coef: float = setting(0.0, "entropy bonus", range=NON_NEGATIVE)
    ppo_mini_batches: int = setting(1, "optimizer steps per pass over the RL batch",
                                    range=AT_LEAST_ONE)
    ppo_epochs: int = setting(1, "passes over the RL batch", range=AT_LEAST_ONE)
    micro_batches: int = setting(1, "gradient-accumulation chunks per optimizer step",
                                 range=AT_LEAST_ONE)
    # One more forward and backward per optimizer step (docs/METHOD.md section 11).
    role_grad_norms: bool = setting(False, "also log the gradient norm of the planner tokens' "
                                    "and of the worker tokens' share of the loss")
    # The rows grow past pack_rows in buckets with the batch's tokens, and the train step's
    # memory with rows / micro_batches: raise micro_batches for a large batch.
    pack_rows: int = setting(8, "the fewest rows of a packed RL batch (more in buckets of "
                             "pack_rows x 2^k as the rollouts need; each bucket one compile)",
                             range=AT_LEAST_ONE)
    pack_len: int = setting(2048, "tokens per packed row; a whole rollout must fit in one row",
                            range=AT_LEAST_ONE)
    # A question's G samples (and workers given one sub-task) start with the same prompt; the
    # packed row then holds it once (trainer/packing.py). The same loss up to float rounding.
    # The setwise ratio packs without it (its sets address columns of their own sequences).
    share_prompts: bool = setting(True, "pack samples that share a prompt after one copy of it "
                                  "(fewer rows to compute; not with rl.ratio=setwise)")

    def consistency_problems(self) -> list[str]:
        # The packer rounds the batch's rows up to micro x mini (x data shards, checked with the
        # mesh): past pack_rows that is rows of padding only, e.g. 10**12 rows never allocate.
        split = self.micro_batches * self.ppo_mini_batches
        if split > self.pack_rows:
            return [f"rl.micro_batches = {self.micro_batches}: rl.micro_batches x "
                    f"rl.ppo_mini_batches = {split} must be <= rl.pack_rows = {self.pack_rows} "
                    f"(each micro-batch is a share of the packed rows)"]
        if self.ratio == "setwise" and self.group_by != "planner":
            return [f"rl.ratio = 'setwise' gives each set (a planner turn and its workers) one "
                    f"advantage, but rl.group_by = {self.group_by!r} gives workers their own: "
                    f"set rl.group_by = 'planner'"]
        return []


# ------------------------------------------------------------------------------------------ sft
@dataclasses.dataclass(frozen=True)
class SFTSection(Section):
    """Supervised warm start on scripted demonstrations of both roles, before RL."""

    PATH = "sft"
    steps: int = setting(200, "SFT optimizer steps (0: none)", range=NON_NEGATIVE)
    lr: float = setting(1e-3, "peak lr (warmup, cosine to 10%)", range=POSITIVE)
    batch_size: int = setting(8, "packed rows per step", range=AT_LEAST_ONE)
    num_demos: int = setting(512, "questions turned into demonstrations", range=NON_NEGATIVE)
    modes: str = setting("", "demonstrated ways of working, e.g. 'matpo+single'; '': rollout.mode")
    # RL runs of different methods/seeds then share one SFT starting point.
    init_checkpoint: str | None = setting(None, "start from another run's SFT checkpoints (its "
                                          "<workdir>/checkpoints/sft) instead of training")
    # < 1 gives a step's rows more planners (data/sft_data.py thin_workers): a pretrained
    # model learns the worker's protocol from a few examples, delegating again from many.
    worker_fraction: float = setting(1.0, "share of the demonstrations' worker conversations "
                                     "trained on (seeded; planners all kept)", range=UNIT)
    wasted_search: float = setting(0.1, "oracle detours per hop: an off-target search first",
                                   range=UNIT)
    wrong_open: float = setting(0.1, "oracle detours per hop: open a wrong result first",
                                range=UNIT)
    # Off: the single agent answers straight from the pages (the grid before Dec 4, docs/repro).
    single_states_facts: bool = setting(True, "single-agent demonstrations state each fact line "
                                        "they read before the next call or the answer, as a "
                                        "worker does")
    report_fact_first: bool = setting(False, "demonstrated final summaries state the fact line "
                                      "before the conclusion (\"Fact: X r Y. Conclusion: Y. "
                                      "Source: ...\"), not after it")
    # Copy pre-training (run/copy_pretraining.py): "span, separator, same span" rows cut from the
    # world's corpus, loss on the repeat only, before SFT step 0 with its own optimizer.
    copy_steps: int = setting(0, "copy pre-training steps before SFT (0: off)", range=NON_NEGATIVE)
    copy_span: int = setting(64, "tokens per copied span (a sequence is 2 * copy_span + 1 tokens)",
                             range=AT_LEAST_ONE)
    copy_shuffle: bool = setting(False, "permute each span's tokens: only copying predicts the "
                                 "repeat")
    copy_lr: float = setting(0.0, "peak lr of the copy phase; 0: sft.lr", range=NON_NEGATIVE)
    copy_every: int = setting(0, "every n-th SFT step trains on a copy batch instead (rehearsal); "
                              "0: off", range=NON_NEGATIVE)
    # A warm start pretrained on reading tasks (configs/synthetic_demo.py) rehearses those.
    rehearsal: str = setting("copy", "what the copy_every-th steps train on: copy spans of the "
                             "corpus, or reading tasks (data/reading_tasks.py)",
                             choices=("copy", "reading"))
    rehearsal_listings: float = setting(0.0, "share of the reading rehearsal's tasks that are "
                                        "search listings (pretrain.listing_fraction's kind)",
                                        range=UNIT)
    # The loss is renormalised so it stays a weighted mean. 1.0 = plain cross-entropy.
    copy_weight: float = setting(1.0, "loss weight of trainable tokens that copy a span of the "
                                 "context (tool arguments, answers, facts)", range=POSITIVE)
    # Grows a from-scratch model's copy (induction) heads.
    context_lm_weight: float = setting(0.0, "language-modelling loss on the demonstrations' "
                                       "context tokens, relative to a trainable token",
                                       range=NON_NEGATIVE)


# ------------------------------------------------------------------------------------- pretrain
@dataclasses.dataclass(frozen=True)
class PretrainSection(Section):
    """`python -m matpo_jax.pretrain`: the reading warm start of the embedded default (data/
    reading_tasks.py), trained from model.arch on random-fact pages of the world, exported as a
    Hugging Face directory that model.hf_checkpoint then names."""

    PATH = "pretrain"
    steps: int = setting(3000, "optimizer steps on reading tasks", range=NON_NEGATIVE)
    lr: float = setting(3e-3, "peak lr (warmup, cosine to 10%)", range=POSITIVE)
    batch_size: int = setting(4, "packed rows (of rl.pack_len tokens) per step",
                              range=AT_LEAST_ONE)
    noise_max: float = setting(0.3, "each page's noise level is drawn from [0, noise_max]",
                               range=UNIT)
    two_hop_fraction: float = setting(0.3, "share of two-page chain tasks", range=UNIT)
    distractor_rate: float = setting(0.5, "one-hop tasks that also show another subject's page",
                                     range=UNIT)
    # Off in the committed warm start (its tasks stay the same draws): docs/findings.md 0n.
    listing_fraction: float = setting(0.0, "share of search-listing tasks: open the result that "
                                      "states the fact, among two", range=UNIT)
    eval_examples: int = setting(512, "held-out reading tasks measured at the end",
                                 range=AT_LEAST_ONE)


# ------------------------------------------------------------------------------------------ train
@dataclasses.dataclass(frozen=True)
class TrainSection(Section):
    PATH = "train"
    steps: int = setting(100, "RL steps (0: SFT only)", range=NON_NEGATIVE)
    seed: int = setting(0, "model init, sampling and data order", range=SEED)
    log_every: int = setting(1, "steps between metric records", range=AT_LEAST_ONE)
    eval_every: int = setting(25, "RL steps between evaluations (0: never)", range=NON_NEGATIVE)
    checkpoint_every: int = setting(25, "steps between checkpoints (0: only at the end)",
                                    range=NON_NEGATIVE)
    keep_checkpoints: int = setting(3, "newest checkpoints kept per phase", range=AT_LEAST_ONE)
    async_checkpointing: bool = setting(True, "write checkpoints in the background")
    remat: str = setting("none", "per-decoder-layer rematerialisation of the train step: none, "
                         "full, or a jax.checkpoint policy that keeps matmul outputs",
                         choices=("none", "full", "dots", "dots_no_batch"))
    max_nonfinite_steps: int = setting(
        3, "consecutive skipped updates (non-finite loss, gradient or parameters) after which a "
        "phase stops, naming the step and the last good checkpoint (0: never stop)",
        range=NON_NEGATIVE)


# ------------------------------------------------------------------------------------------- eval
@dataclasses.dataclass(frozen=True)
class EvalSection(Section):
    PATH = "eval"
    datasets: tuple[str, ...] = setting(("synthetic_multihop",), "datasets evaluated",
                                        choices=DATASETS)
    split: str = setting("validation", "the split evaluated")
    num_questions: int = setting(64, "first questions of the split (0: the whole split)",
                                 range=NON_NEGATIVE)
    temperature: float = setting(0.0, "sampling temperature of evaluation (0: greedy)",
                                 range=NON_NEGATIVE)
    # The validation curve (run/eval/curve.py): the same questions every time, the first ones of
    # the full evaluation, so its step-0 and last points come free from the evaluations after SFT
    # and after RL; only the evaluations in between cost rollouts.
    curve_questions: int = setting(
        96, "validation curve: every train.eval_every RL steps evaluate only the first N of the "
        "evaluated questions (at most eval.num_questions) and log curve/... at the RL step; the "
        "synthetic world's evaluation only, benchmarks are evaluated whole (0: no curve, the "
        "whole evaluation every train.eval_every steps)", range=NON_NEGATIVE)


# ------------------------------------------------------------------------------------ experiment
# Splits of the synthetic world (data/synthetic_world.py SPLITS; "sft" exists when
# data.sft_fraction > 0). A test keeps the two lists equal.
SYNTHETIC_SPLITS = ("train", "validation", "test")
SYNTHETIC_SFT_SPLIT = "sft"


def sft_modes(cfg) -> tuple[str, ...]:
    """The ways of working SFT demonstrates: `sft.modes` ("matpo+single"), or the rollout mode."""
    return tuple(m.strip() for m in str(cfg.sft.modes or cfg.rollout.mode).split("+") if m.strip())


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """A whole experiment; every field of every section. Built from a config file's ConfigDict by
    `to_typed`, or directly; either way valid (each section checks itself, and this class the
    rules between sections)."""

    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    mesh: MeshSection = dataclasses.field(default_factory=MeshSection)
    data: DataSection = dataclasses.field(default_factory=DataSection)
    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    chat: ChatSection = dataclasses.field(default_factory=ChatSection)
    tools: ToolsSection = dataclasses.field(default_factory=ToolsSection)
    reward: RewardSection = dataclasses.field(default_factory=RewardSection)
    rl: RLSection = dataclasses.field(default_factory=RLSection)
    sft: SFTSection = dataclasses.field(default_factory=SFTSection)
    pretrain: PretrainSection = dataclasses.field(default_factory=PretrainSection)
    train: TrainSection = dataclasses.field(default_factory=TrainSection)
    eval: EvalSection = dataclasses.field(default_factory=EvalSection)

    def __post_init__(self):
        problems = self.consistency_problems()
        if problems:
            raise ConfigError(problems)

    @classmethod
    def unchecked(cls, sections: dict[str, Section]) -> "ExperimentConfig":
        """Without the rules between sections (to_typed collects every problem before raising)."""
        obj = object.__new__(cls)
        for name, section in sections.items():
            object.__setattr__(obj, name, section)
        return obj

    def to_dict(self) -> dict:
        """Nested plain dict (tuples kept), e.g. for config.json."""
        return dataclasses.asdict(self)

    def replace(self, **sections) -> "ExperimentConfig":
        return dataclasses.replace(self, **sections)

    def consistency_problems(self) -> list[str]:
        """The rules between sections: what would otherwise fail (or mislead) later in the run."""
        problems = []
        ro = self.rollout
        if self.rl.pack_len < ro.max_context:
            problems.append(f"rl.pack_len = {self.rl.pack_len}: must be >= rollout.max_context = "
                            f"{ro.max_context} so every rollout fits in one packed row")
        if self.reward.method == "judge" and not self.reward.judge_url:
            problems.append("reward.judge_url must be set when reward.method = 'judge'")
        if self.tools.search_backend != "local" and not self.tools.search_url:
            problems.append(f"tools.search_url must be set when tools.search_backend = "
                            f"{self.tools.search_backend!r}")
        for mode in sft_modes(self):
            if mode not in ROLLOUT_MODES:
                problems.append(f"sft.modes = {self.sft.modes!r}: {mode!r} is not one of "
                                f"{', '.join(ROLLOUT_MODES)}")
        if self.sft.steps > 0 and self.sft.num_demos == 0 and not self.sft.init_checkpoint:
            problems.append(f"sft.num_demos = 0: SFT (sft.steps = {self.sft.steps}) needs "
                            f"demonstrations; set sft.steps = 0 to skip it")
        if self.data.name != "synthetic_multihop":
            problems += self._published_data_problems()
        if self.data.name == "synthetic_multihop":
            splits = SYNTHETIC_SPLITS + ((SYNTHETIC_SFT_SPLIT,) if self.data.sft_fraction > 0
                                         else ())
            for path, split in (("data.split", self.data.split), ("eval.split", self.eval.split)):
                if split not in splits:
                    problems.append(f"{path} = {split!r}: the synthetic world's splits are "
                                    f"{', '.join(splits)}")
        return problems

    def _published_data_problems(self) -> list[str]:
        """Training on a published dataset: no scripted demonstrations, the checkpoint's
        tokenizer, a split the dataset has, no synthetic evaluation."""
        name = self.data.name
        problems = []
        if self.sft.steps > 0 and not self.sft.init_checkpoint:
            problems.append(f"sft.steps = {self.sft.steps}: scripted SFT demonstrations exist only "
                            f"for the synthetic world (data.name = {name!r}); set sft.steps = 0 "
                            f"to start RL from the checkpoint")
        if self.data.rl_skips_demonstrated:
            problems.append(f"data.rl_skips_demonstrated: no SFT demonstrations on "
                            f"data.name = {name!r}; set it False")
        if not (self.model.hf_checkpoint or self.model.tokenizer):
            problems.append(f"model.hf_checkpoint: data.name = {name!r} needs a Hugging Face "
                            f"tokenizer (model.hf_checkpoint or model.tokenizer); only the "
                            f"synthetic world trains its own")
        if self.data.split not in PUBLISHED_SPLITS[name]:
            problems.append(f"data.split = {self.data.split!r}: {name}'s splits are "
                            f"{', '.join(PUBLISHED_SPLITS[name])}")
        if "synthetic_multihop" in self.eval.datasets:
            problems.append(f"eval.datasets: 'synthetic_multihop' is evaluated only in runs on "
                            f"the synthetic world (data.name = {name!r}); list the benchmarks, "
                            f"e.g. musique,frames")
        return problems


SECTIONS: dict[str, type[Section]] = {
    f.name: f.default_factory for f in dataclasses.fields(ExperimentConfig)}
