"""The paper's reference MATPO run (docs/METHOD.md section 9), Qwen3-4B on MuSiQue, for a TPU pod.

  python -m matpo_jax.train --config=configs/qwen3_4b_musique.py:checkpoint=DIR \
      --config.data.manual_dir=M --workdir=gs://...
  python -m matpo_jax.train --config=configs/qwen3_4b_musique.py:checkpoint=DIR,offline \
      --config.data.manual_dir=M --workdir=...

Arguments: mode=matpo|single (the single-agent GRPO baseline keeps every other setting),
checkpoint=DIR (a Hugging Face Qwen3-4B directory on each host: weights, tokenizer and chat
template), and offline (below). M holds musique/musique_ans_v1.0_{train,dev}.jsonl as published
(and frames/, webwalkerqa/, gaia/ for the evaluations); the dataset is prepared once into
data.data_dir (default <workdir>/tfds). RL starts from the checkpoint (sft.steps = 0).

Online (the paper's setting): Serper search (SERPER_API_KEY in the environment), `open` fetches
the page, an OpenAI-compatible judge at reward.judge_url (OPENAI_API_KEY) grades, evaluations on
GAIA, FRAMES and WebWalkerQA.
offline (Search-R1 style, no network): the local search service over MuSiQue's paragraphs
(search and open), exact match against the answer and its aliases, evaluations on MuSiQue's
validation split.
"""
from matpo_jax.config import base_config, parse_arg


def get_config(arg=None):
    arg = parse_arg(arg, mode="matpo", checkpoint="/mnt/disks/persist/Qwen3-4B", offline=False)
    c = base_config()

    c.model.hf_checkpoint = arg.checkpoint  # its config.json gives the dimensions below
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"  # f32 master weights and Adam moments
    c.model.arch.update(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                        max_position_embeddings=40960)
    c.mesh.update(data=1, fsdp=-1, tensor=4)  # e.g. v5p-128: 64 chips -> fsdp 16 x tensor 4

    c.data.name = "musique"  # 6,175 filtered train questions
    c.data.split = "train"
    c.data.batch_size = 256  # queries per RL step

    c.rollout.mode = arg.mode
    c.rollout.group_size = 8
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = 0
    c.rollout.max_turns_planner = 20
    c.rollout.max_turns_worker = 20
    c.rollout.max_context = 40960  # prompt 3,072 + response 37,888
    c.rollout.max_new_tokens_per_turn = 8192
    c.rollout.decode_slots = 512
    c.rollout.report_max_chars = 20000
    c.rollout.final_summary = True
    c.rollout.final_summary_max_tokens = 4096
    c.rollout.user_query_recap = True
    c.rollout.async_tools = True  # web search and page reads take ~1 s: decode on meanwhile

    # Qwen3's thinking mode (its chat template's default): the checkpoints are reasoning models,
    # trained here as released; each turn may reason in <think> first, and the
    # answer is read after the last </think> (rl/rewards.py). False would append Qwen3's empty
    # think block to every generation prompt (shorter turns, no reasoning).
    c.chat.enable_thinking = True

    c.tools.search_backend = "serper"
    # Tool URLs are endpoints, used as given (the clients no longer append /search or /page).
    c.tools.search_url = "https://google.serper.dev/search"
    c.tools.page_backend = "fetch"  # `open` fetches the URL and extracts its main text
    c.tools.max_response_chars = 20000
    c.tools.timeout_s = 60.0
    c.tools.retries = 3
    # Qwen3 often calls several tools in one turn; each runs, at once, answered in call order.
    c.tools.max_calls_per_turn = 4

    c.reward.method = "judge"  # SimpleQA-style grading by gpt-4o-mini, as the reference
    c.reward.judge_url = "https://api.openai.com/v1"
    c.reward.judge_model = "gpt-4o-mini"

    c.rl.lr = 1e-5
    c.rl.schedule = "constant"
    c.rl.warmup_steps = 0
    c.rl.weight_decay = 0.01
    c.rl.grad_clip = 1.0
    c.rl.eps_low = 0.2
    c.rl.eps_high = 0.2
    c.rl.dual_clip_c = 3.0
    c.rl.loss_agg = "token-mean"
    c.rl.kl_coef = 0.0  # no KL, no entropy bonus
    c.rl.entropy_coef = 0.0
    c.rl.ppo_mini_batches = 1  # one optimizer step per RL step
    c.rl.ppo_epochs = 1
    c.rl.pack_rows = 16
    c.rl.pack_len = 40960

    c.sft.steps = 0  # the instruct checkpoint already follows the tool-call format

    c.train.steps = 180
    c.train.eval_every = 20
    c.train.checkpoint_every = 10
    c.train.keep_checkpoints = 3
    # 40,960-token rows: each decoder layer's activations are recomputed in the backward pass.
    c.train.remat = "full"

    c.eval.datasets = ("gaia", "frames", "webwalkerqa")
    c.eval.split = "test"
    c.eval.num_questions = 0  # all: GAIA-text 103, FRAMES 824, WebWalkerQA 680
    c.eval.temperature = 0.0
    c.eval.curve_questions = 0  # no curve: the benchmarks are evaluated whole every eval_every steps
    if arg.offline:
        c.tools.update(search_backend="local", search_url=None, page_backend="service",
                       page_url=None)
        c.rollout.async_tools = False  # the local service answers in ~1 ms
        c.reward.update(method="exact", judge_url=None)
        c.eval.datasets = ("musique",)  # its validation split, over the same corpus
    return c
