"""The real pretrained SmolLM2-135M-Instruct as a benchmark, side by side with PyTorch, one run.

Both sides load the same float32 weights from models/smollm2-135m-instruct (`make smollm2`):
ours with matpo_jax.model.load_pretrained, PyTorch's with transformers'
AutoModelForCausalLM.from_pretrained (LlamaForCausalLM, sdpa attention). The text is real English
(the GNU GPL v3 as Debian ships it in /usr/share/common-licenses/GPL-3, else Python's own
reference manual, pydoc_data.topics), tokenized with the model's tokenizer into one id stream
that prompts and training sequences are cut from. torch uses as many threads as XLA's CPU client
(every core), with OMP_WAIT_POLICY=PASSIVE (see below). Each part interleaves the two sides' timed repeats (best_times_interleaved of
benchmarks/sampler.py, or the same loop), so that other load on this shared machine hits both.

1. Decode: our sampler (matpo_jax.sampler.loop.generate: the jitted slot loop, KV cache, greedy)
   vs transformers' `generate` (greedy, use_cache) at batch 1, 8 and 32: the same equal-length
   prompts (no padding), every row forced to the full number of new tokens (ours: no stop ids;
   theirs: no EOS id, so neither side masks any token and both are plain argmax decoding). Time =
   the whole call (prefill + decode), best of the repeats after a warm-up (our compilation is
   timed separately). Also each side's prefill alone (1 new token), and the greedy cross-check:
   the fraction of rows whose new tokens are identical on both sides.
2. Train step: our packed train step (trainer.step.make_train_step over a
   packing.pack_sequences batch, objective "sft", LossConfig loss_agg="token-mean": the
   SFT phase's cross-entropy, every trainable token weighted 1 / (all trainable tokens), i.e. the
   token-mean cross-entropy) vs a PyTorch step (LlamaForCausalLM forward with labels, whose loss
   is the token-mean cross-entropy over the labelled tokens, backward, clip_grad_norm_(1.0),
   torch.optim.AdamW) on the SAME packed rows: transformers >= 4.5x detects packed sequences from
   position_ids that restart (masking_utils.find_packed_sequence_indices) and builds the
   block-diagonal causal mask for sdpa and eager attention too, so PyTorch gets exactly our
   tokens, positions and rows; labels are the tokens where our loss mask is set, -100 elsewhere
   (a segment's first token and padding). Both optimizers: lr 1e-5, weight decay 0.01, betas
   (0.9, 0.999), eps 1e-8, global-norm clip 1.0; the whole batch is one micro-batch on both
   sides. Reported: trained tokens/s (real tokens / step), and the loss of the first step (the
   same weights, before any update) on both sides.
3. Where the time goes: compile vs run, forward vs forward + backward + update, and the step's
   two big ingredients timed alone on each side at the step's shapes: its weight matmuls (every
   projection's forward, input-gradient and weight-gradient GEMM, x 30 layers, plus the tied LM
   head) and its causal within-segment attention (forward + backward, x 30 layers); plus a bare
   decode step (cache-free one-token forward vs model.decode over the cache) at batch 1 and 32.

    python benchmarks/smollm2.py            # ~15 min on a 2-core CPU; writes
                                            # benchmarks/results/smollm2_bench.{json,md}
    python benchmarks/smollm2.py --quick    # tiny sizes, same code paths, writes nothing (< 2 min)
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# libgomp (torch's OpenMP) spin-waits at every barrier by default: on this shared 2-core machine,
# with another process holding a core, 2 torch threads then ran 3-4x slower than with
# OMP_WAIT_POLICY=PASSIVE (and slower than 1 thread; measured here, a 8 x 64-token forward: 10-11 s
# vs 2.6-2.9 s). Set before torch loads; XLA's CPU threads do not use OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sampler as sampler_bench  # noqa: E402  (benchmarks/sampler.py)
import train_step as train_step_bench  # noqa: E402  (benchmarks/train_step.py)
from matpo_jax import parallel  # noqa: E402
from matpo_jax.config import RLSection  # noqa: E402
from matpo_jax.model import load_pretrained  # noqa: E402
from matpo_jax.model.packed_attention import packed_attention  # noqa: E402
from matpo_jax.run.runtime import loss_config  # noqa: E402
from matpo_jax.trainer import loss as loss_lib  # noqa: E402
from matpo_jax.trainer import packing  # noqa: E402
from matpo_jax.trainer import step as ts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
MODEL_DIR = ROOT / "models" / "smollm2-135m-instruct"
TEXT_FILE = "/usr/share/common-licenses/GPL-3"
# The SFT phase's cross-entropy with the token-mean weighting transformers' loss uses.
LOSS = dataclasses.replace(loss_config(RLSection()), loss_agg="token-mean", entropy_metrics=False)
LR, WEIGHT_DECAY, GRAD_CLIP = 1e-5, 0.01, 1.0
QUICK_LAYERS = 2  # --quick: SmolLM2's first two layers (embedding, final norm and head as is)


# ----------------------------------------------------------------------------- data and models

def english_ids(tokenizer) -> tuple[np.ndarray, str]:
    """One stream of token ids of real English text, and where the text came from."""
    if os.path.isfile(TEXT_FILE):
        text, source = Path(TEXT_FILE).read_text(), TEXT_FILE
    else:
        import pydoc_data.topics
        topics = pydoc_data.topics.topics
        text, source = "\n\n".join(topics[k] for k in sorted(topics)), "pydoc_data.topics"
    text = " ".join(text.split())  # the license's hard line breaks and indentation as spaces
    ids = np.asarray(tokenizer(text, add_special_tokens=False).input_ids, np.int32)
    return ids, source


def windows(ids: np.ndarray, lengths, start: int = 0) -> list[np.ndarray]:
    """Consecutive pieces of the stream, wrapping around at its end."""
    out, at = [], start
    for n in lengths:
        out.append(np.take(ids, np.arange(at, at + n), mode="wrap"))
        at += n
    return out


def load_models(path):
    ours = load_pretrained(str(path))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="sdpa").eval()
    # No EOS anywhere in generation: every row runs to max_new_tokens and nothing is masked
    # (min_new_tokens would mask EOS on their side only and change greedy picks).
    theirs.generation_config.eos_token_id = None
    return ours, theirs


def truncated_copy(path, layers: int, dest: str) -> str:
    """The checkpoint's first `layers` decoder layers as a checkpoint of their own (--quick:
    the same code paths, a fraction of the compile and run time)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, num_hidden_layers=layers)
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.isfile(os.path.join(path, name)):
            shutil.copy(os.path.join(path, name), dest)
    return dest


def matmul_params(hf_model) -> int:
    """Parameters that are matmul operands (the tied embedding counts once: as the LM head)."""
    return sum(p.numel() for n, p in hf_model.named_parameters() if "norm" not in n)


# ----------------------------------------------------------------------------- part 1: decode

def hf_generate(hf_model, prompts: np.ndarray, new_tokens: int, threads: int, keep: dict):
    input_ids = torch.as_tensor(prompts, dtype=torch.long)
    attention_mask = torch.ones_like(input_ids)

    def run(new_tokens=new_tokens):
        torch.set_num_threads(threads)
        with torch.no_grad():
            out = hf_model.generate(input_ids, attention_mask=attention_mask, do_sample=False,
                                    max_new_tokens=new_tokens, use_cache=True, pad_token_id=2)
        assert out.shape == (prompts.shape[0], prompts.shape[1] + new_tokens), out.shape
        keep["hf"] = out[:, prompts.shape[1]:].numpy()
    return run


def ours_generate(model, prompts: np.ndarray, new_tokens: int, keep: dict):
    run = sampler_bench.ours_generate(model, prompts, new_tokens)  # asserts full-length rows

    def keeping():
        keep["ours"] = np.asarray([np.asarray(t) for t in run()])
    return keeping


def decode_part(ours, theirs, ids, batches, prompt_len, new_tokens, repeats, threads):
    rows = []
    all_prompts = np.stack(windows(ids, [prompt_len] * max(batches)))
    for batch in batches:
        prompts = all_prompts[:batch]
        keep = {}
        ours_run = ours_generate(ours, prompts, new_tokens, keep)
        hf_run = hf_generate(theirs, prompts, new_tokens, threads, keep)
        start = time.perf_counter()
        ours_run()  # compiles (the slot loop for this batch and length) and runs once
        ours_first_s = time.perf_counter() - start
        ours_prefill = ours_generate(ours, prompts, 1, {})
        hf_prefill = hf_generate(theirs, prompts, 1, threads, {})
        start = time.perf_counter()
        ours_prefill()
        ours_prefill_first_s = time.perf_counter() - start
        best = sampler_bench.best_times_interleaved(dict(
            ours=(ours_run, lambda: None), hf=(hf_run, lambda: hf_run(new_tokens=2)),
            ours_prefill=(ours_prefill, lambda: None), hf_prefill=(hf_prefill, hf_prefill),
        ), repeats)
        same_rows = (keep["ours"] == keep["hf"]).all(axis=1)
        first_diff = [int(np.argmax(a != b)) for a, b in zip(keep["ours"], keep["hf"])
                      if (a != b).any()]
        tokens = batch * new_tokens
        row = dict(batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
                   ours_s=best["ours"], hf_s=best["hf"],
                   ours_tok_s=tokens / best["ours"], hf_tok_s=tokens / best["hf"],
                   speedup=best["hf"] / best["ours"],
                   ours_prefill_s=best["ours_prefill"], hf_prefill_s=best["hf_prefill"],
                   ours_decode_ms_per_token_step=1e3 * (best["ours"] - best["ours_prefill"])
                   / max(1, new_tokens - 1),
                   hf_decode_ms_per_token_step=1e3 * (best["hf"] - best["hf_prefill"])
                   / max(1, new_tokens - 1),
                   ours_compile_and_first_run_s=ours_first_s,
                   ours_prefill_compile_and_first_run_s=ours_prefill_first_s,
                   greedy_identical_rows=float(same_rows.mean()),
                   greedy_first_divergence=first_diff,
                   sample_continuation_ids=keep["hf"][0][:16].tolist())
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "sample_continuation_ids"}),
              "load", os.getloadavg(), flush=True)
    return rows


# ----------------------------------------------------------------------------- part 2: train

def train_sequences(ids, lengths, start):
    return [packing.TrainSequence(tokens=t, trainable=np.ones(len(t), bool),
                                  old_logprobs=np.zeros(len(t), np.float32), advantage=0.0,
                                  role_id=0, rollout_id=i, group_id=i)
            for i, t in enumerate(windows(ids, lengths, start))]


class OursTrain:
    """Our compiled train step on the packed batch; `step()` runs and times one blocking step."""

    def __init__(self, model, batch: packing.PackedBatch):
        self.batch = batch
        mesh = parallel.make_mesh(devices=jax.devices()[:1])
        tx = ts.make_optimizer(ts.OptimizerConfig(learning_rate=LR, weight_decay=WEIGHT_DECAY,
                                                  grad_clip=GRAD_CLIP))
        config = ts.TrainStepConfig(objective="sft", loss=LOSS, micro_batches=1)
        self.graphdef, self.state, shardings = ts.init_train_state(model, tx, mesh)
        step = ts.make_train_step(self.graphdef, tx, config, mesh, shardings)
        self.device_batch = jax.device_put(batch, parallel.batch_sharding(mesh))
        start = time.perf_counter()
        self.compiled = step.jitted.lower(self.state, self.device_batch).compile()
        self.compile_s = time.perf_counter() - start
        graphdef = self.graphdef

        def forward_loss(params, frozen, batch):
            return loss_lib.model_objective(nnx.merge(graphdef, params, frozen), batch, LOSS,
                                            objective="sft")[0]
        start = time.perf_counter()
        self.forward = jax.jit(forward_loss).lower(
            self.state.params, self.state.frozen, self.device_batch).compile()
        self.forward_compile_s = time.perf_counter() - start
        self.losses = []

    def step(self):
        self.state, metrics = self.compiled(self.state, self.device_batch)
        jax.block_until_ready((self.state, metrics))
        self.losses.append(float(metrics["loss"]))

    def forward_only(self):
        jax.block_until_ready(self.forward(self.state.params, self.state.frozen,
                                           self.device_batch))


class TorchTrain:
    """LlamaForCausalLM + AdamW on the same packed rows (position_ids restart per segment)."""

    def __init__(self, path, batch: packing.PackedBatch, threads: int):
        self.threads = threads
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch.float32, attn_implementation="sdpa")
        self.model.train()
        # As ours: decoupled weight decay on matrices only (not the RMSNorm scales); the fused
        # CPU kernel (one pass per tensor), PyTorch's fastest AdamW here.
        params = dict(self.model.named_parameters())
        groups = [dict(params=[p for n, p in params.items() if "norm" not in n],
                       weight_decay=WEIGHT_DECAY),
                  dict(params=[p for n, p in params.items() if "norm" in n], weight_decay=0.0)]
        self.opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8, fused=True)
        self.input_ids = torch.as_tensor(batch.tokens, dtype=torch.long)
        self.position_ids = torch.as_tensor(batch.positions, dtype=torch.long)
        labels = np.where(batch.loss_mask > 0, batch.tokens, -100)
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        self.losses = []

    def _loss(self):
        return self.model(input_ids=self.input_ids, position_ids=self.position_ids,
                          labels=self.labels, use_cache=False).loss

    def step(self):
        torch.set_num_threads(self.threads)
        loss = self._loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(float(loss.detach()))

    def forward_only(self):
        torch.set_num_threads(self.threads)
        with torch.no_grad():
            self._loss()


def torch_op_profile(side: TorchTrain, top: int = 12) -> dict:
    """Self CPU time of one PyTorch step by operator (torch.profiler), grouped."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        side.step()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    groups = {"matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
              "attention": ("flash_attention", "scaled_dot_product", "_efficient_attention")}
    shares = {g: 0.0 for g in groups}
    for e in events:
        for g, keys in groups.items():
            if any(k in e.key for k in keys):
                shares[g] += e.self_cpu_time_total
                break
    return dict(total_self_cpu_s=total / 1e6,
                share={g: v / total for g, v in shares.items()},
                top=[dict(op=e.key, self_cpu_s=e.self_cpu_time_total / 1e6, calls=e.count)
                     for e in events[:top]])


def train_part(path, ours_model, ids, lengths, row_len, repeats, threads, start_token):
    seqs = train_sequences(ids, lengths, start_token)
    batch = packing.pack_sequences(seqs, row_len, row_len_multiple=128, loss_config=LOSS)
    real = int((batch.segment_ids > 0).sum())
    print(f"train batch: {len(seqs)} sequences {lengths}, packed {batch.shape}, {real} tokens, "
          f"efficiency {batch.efficiency():.3f}, {batch.num_loss_tokens()} loss tokens", flush=True)
    ours = OursTrain(ours_model, batch)
    print(f"ours: train step compiled in {ours.compile_s:.1f}s, forward in "
          f"{ours.forward_compile_s:.1f}s", flush=True)
    theirs = TorchTrain(path, batch, threads)
    # The first step of each side is the same weights before any update: the loss to compare.
    first = {}
    for name, side in (("ours", ours), ("torch", theirs)):
        start = time.perf_counter()
        side.step()
        first[name] = time.perf_counter() - start
    loss_ours, loss_torch = ours.losses[0], theirs.losses[0]
    print(f"loss before the update: ours {loss_ours:.6f}, torch {loss_torch:.6f}", flush=True)
    best = sampler_bench.best_times_interleaved(dict(
        ours=(ours.step, lambda: None), torch=(theirs.step, lambda: None),
        ours_forward=(ours.forward_only, ours.forward_only),
        torch_forward=(theirs.forward_only, theirs.forward_only)), repeats)
    result = dict(
        sequences=len(seqs), lengths=list(map(int, lengths)), rows=batch.shape[0],
        row_len=batch.shape[1], tokens=real, loss_tokens=batch.num_loss_tokens(),
        efficiency=batch.efficiency(), layout="packed (the same rows, positions restart per "
        "segment) on both sides", micro_batches=1,
        loss="token-mean cross-entropy (ours: objective sft, LossConfig loss_agg=token-mean; "
             "torch: LlamaForCausalLM labels loss)",
        ours_loss_before_update=loss_ours, torch_loss_before_update=loss_torch,
        loss_abs_diff=abs(loss_ours - loss_torch),
        loss_rel_diff=abs(loss_ours - loss_torch) / abs(loss_torch),
        ours_losses=ours.losses, torch_losses=theirs.losses,
        ours_step_s=best["ours"], torch_step_s=best["torch"],
        ours_tokens_per_s=real / best["ours"], torch_tokens_per_s=real / best["torch"],
        speedup=best["torch"] / best["ours"],
        ours_forward_s=best["ours_forward"], torch_forward_s=best["torch_forward"],
        ours_compile_s=ours.compile_s, ours_forward_compile_s=ours.forward_compile_s,
        ours_first_step_s=first["ours"], torch_first_step_s=first["torch"])
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("losses")}), "load",
          os.getloadavg(), flush=True)
    return result, ours, theirs


# ----------------------------------------------------------------------------- part 3: profile

def _best(fn, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def gemm_shapes(cfg, tokens):
    """(m, k, n, count) of every weight GEMM of one train step (forward, input gradient, weight
    gradient of each projection, x layers; the tied LM head once)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    layers = cfg.num_hidden_layers
    per_layer = [(h, q, 2), (h, kv, 2), (h, i, 2), (i, h, 1)]  # q + o, k + v, gate + up, down
    shapes = []
    for k, n, count in per_layer + [(h, cfg.vocab_size, 0)]:
        c = count * layers or 1
        shapes += [(tokens, k, n, c), (tokens, n, k, c), (k, tokens, n, c)]  # fwd, dX, dW
    return shapes


def matmul_component(cfg, tokens, threads, repeats, head_fraction=4):
    """Seconds of the step's weight GEMMs, each shape timed alone on each side, interleaved.
    The LM head's three (the largest) are timed at 1/head_fraction of the tokens and scaled up
    (their time is linear in the token count at these sizes)."""
    out = {"ours": 0.0, "torch": 0.0, "flops": 0.0, "shapes": []}
    for m, k, n, count in gemm_shapes(cfg, tokens):
        scale = 1
        if cfg.vocab_size in (m, k, n) and tokens >= 512 * head_fraction:
            scale = head_fraction
            m, k = (m // scale, k) if m == tokens else (m, k // scale)
        a_np = np.random.default_rng(0).standard_normal((m, k), np.float32)
        b_np = np.random.default_rng(1).standard_normal((k, n), np.float32)
        a, b = jnp.asarray(a_np), jnp.asarray(b_np)
        at, bt = torch.from_numpy(a_np), torch.from_numpy(b_np)
        dot = jax.jit(jnp.dot)

        def torch_mm():
            torch.set_num_threads(threads)
            torch.mm(at, bt)
        best = sampler_bench.best_times_interleaved(dict(
            ours=(lambda: jax.block_until_ready(dot(a, b)),) * 2, torch=(torch_mm, torch_mm)),
            repeats)
        out["shapes"].append(dict(m=m * (scale if m == tokens // scale else 1), k=k, n=n,
                                  count=count, timed_at_fraction=1 / scale,
                                  ours_s=best["ours"], torch_s=best["torch"],
                                  ours_gflop_s=2 * m * k * n / best["ours"] / 1e9,
                                  torch_gflop_s=2 * m * k * n / best["torch"] / 1e9))
        out["ours"] += count * scale * best["ours"]
        out["torch"] += count * scale * best["torch"]
        out["flops"] += count * scale * 2 * m * k * n
    return out


def attention_component(cfg, batch: packing.PackedBatch, threads, repeats):
    """Seconds of the step's attention, forward + backward, x layers: ours packed_attention
    (flash-style, within segments) vs torch sdpa with the block-diagonal causal mask that
    transformers builds from the position ids."""
    rows, length = batch.shape
    heads, kv_heads, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rng = np.random.default_rng(0)
    q_np = rng.standard_normal((rows, length, heads, dim), np.float32)
    k_np = rng.standard_normal((rows, length, kv_heads, dim), np.float32)
    v_np = rng.standard_normal((rows, length, kv_heads, dim), np.float32)
    seg = jnp.asarray(batch.segment_ids)

    @jax.jit
    def ours_fwd_bwd(q, k, v):
        return jax.grad(lambda q, k, v: packed_attention(q, k, v, seg).sum(),
                        argnums=(0, 1, 2))(q, k, v)
    q, k, v = map(jnp.asarray, (q_np, k_np, v_np))
    ours_run = lambda: jax.block_until_ready(ours_fwd_bwd(q, k, v))

    # transformers' mask: same segment (position ids restart), causal; padding its own segment.
    pos = torch.as_tensor(batch.positions)
    diff = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1)
    segment = (diff != 1).cumsum(-1)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    mask = (segment[:, None, :, None] == segment[:, None, None, :]) & causal
    tq = torch.from_numpy(q_np).transpose(1, 2).requires_grad_()
    tk = torch.from_numpy(k_np).transpose(1, 2).requires_grad_()
    tv = torch.from_numpy(v_np).transpose(1, 2).requires_grad_()

    def torch_run():
        torch.set_num_threads(threads)
        out = torch.nn.functional.scaled_dot_product_attention(
            tq, tk, tv, attn_mask=mask, enable_gqa=True)
        out.sum().backward()
        tq.grad = tk.grad = tv.grad = None
    best = sampler_bench.best_times_interleaved(
        dict(ours=(ours_run, ours_run), torch=(torch_run, torch_run)), repeats)
    layers = cfg.num_hidden_layers
    return {"ours": layers * best["ours"], "torch": layers * best["torch"]}


def xla_op_profile(ours: OursTrain, top: int = 12) -> dict:
    """Our step under jax.profiler: the XLA:CPU thunks' self time, by kind of HLO op."""
    import glob
    import gzip
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            ours.step()
        path = glob.glob(os.path.join(tmp, "plugins", "profile", "*", "perfetto_trace.json.gz"))
        if not path:
            return {}
        trace = json.load(gzip.open(path[0]))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ops = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
    # Self time: an op's duration less the ops nested in it on the same thread (while bodies).
    by_thread = {}
    for e in ops:
        by_thread.setdefault(e["tid"], []).append(e)
    self_time = {}
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                self_time[id(stack[-1])] -= e["dur"]
            self_time[id(e)] = e["dur"]
            stack.append(e)
    totals = {}
    for e in ops:
        key = (e["name"], e["args"]["hlo_op"])
        totals[key] = totals.get(key, 0.0) + self_time[id(e)]
    kinds = {}
    for (name, op), us in totals.items():
        kind = "dot / ynn matmul" if ("dot" in op or "ynn" in name or "dot" in name) else (
            "while / conditional (loop control)" if op.startswith(("while", "conditional"))
            else "fusion (elementwise, reductions)" if "fusion" in op
            else "other (copies, scatter, gather, ...)")
        kinds[kind] = kinds.get(kind, 0.0) + us
    total = sum(kinds.values())
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return dict(total_thunk_s=total / 1e6, share={k: v / total for k, v in kinds.items()},
                top=[dict(thunk=n, hlo_op=o, self_s=us / 1e6) for (n, o), us in ranked])


def profile_part(theirs_train: TorchTrain, ours_train: OursTrain, cfg, threads, repeats):
    batch = ours_train.batch
    padded_tokens = batch.shape[0] * batch.shape[1]
    out = dict(gemm_tokens=padded_tokens)
    out["matmuls"] = matmul_component(cfg, padded_tokens, threads, repeats)
    print("matmuls", json.dumps(out["matmuls"]), flush=True)
    out["attention"] = attention_component(cfg, batch, threads, repeats)
    print("attention", json.dumps(out["attention"]), flush=True)
    out["torch_ops"] = torch_op_profile(theirs_train)
    out["xla_ops"] = xla_op_profile(ours_train)
    print("xla ops", json.dumps(out["xla_ops"].get("share")), flush=True)
    return out


# ----------------------------------------------------------------------------- report

def _git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def sizes(quick: bool, repeats: int) -> dict:
    if quick:
        return dict(batches=(2,), prompt_len=16, new_tokens=4, repeats=1,
                    train_lengths=[40, 56], row_len=128)
    # 8 sequences of 128-320 tokens (~1,800). Both sides' train states (params, grads, Adam
    # moments: ~2.2 GB each), activations and PyTorch's [rows, T, 49,152] logits live in one
    # process; 8 x 256-512 tokens (2,741) was OOM-killed at 16.5 GB on this shared 23 GB machine
    # while other runs held the rest.
    return dict(batches=(1, 8, 32), prompt_len=64, new_tokens=64, repeats=repeats,
                train_lengths=np.random.default_rng(0).integers(128, 321, 8).tolist(),
                row_len=1024)


def run_part(part: str, model_path: str, size: dict, skip_profile: bool) -> dict:
    """One part in this process: 'decode' (part 1) or 'train' (parts 2 and 3)."""
    import resource
    threads = os.cpu_count()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    ids, source = english_ids(tokenizer)
    print(f"[{part}] {len(ids)} tokens of English from {source}; load {os.getloadavg()}",
          flush=True)
    out = dict(text=dict(source=source, tokens=int(len(ids))))
    if part == "decode":
        ours, theirs = load_models(model_path)
        out["decode"] = decode_part(ours, theirs, ids, size["batches"], size["prompt_len"],
                                    size["new_tokens"], size["repeats"], threads)
    else:
        ours = load_pretrained(str(model_path))
        cfg = ours.config
        out["train"], ours_train, theirs_train = train_part(
            model_path, ours, ids, size["train_lengths"], size["row_len"], size["repeats"],
            threads, start_token=max(size["batches"]) * size["prompt_len"])
        out["profile"] = None if skip_profile else profile_part(
            theirs_train, ours_train, cfg, threads, max(1, size["repeats"] - 1))
        hf = theirs_train.model
        out["model"] = dict(family="llama", params=sum(p.numel() for p in hf.parameters()),
                            matmul_params=matmul_params(hf), layers=cfg.num_hidden_layers,
                            hidden=cfg.hidden_size, heads=cfg.num_attention_heads,
                            kv_heads=cfg.num_key_value_heads, vocab=cfg.vocab_size,
                            dtype="float32")
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes; writes nothing")
    parser.add_argument("--model", default=str(MODEL_DIR))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--skip_profile", action="store_true")
    parser.add_argument("--markdown_from", default=None, metavar="JSON",
                        help="only rewrite the markdown from a result JSON (runs nothing)")
    # Internal: each part runs in a child process of its own, so that one part's memory (compiled
    # programs, the other side's model, allocator high-water marks) is gone before the next.
    parser.add_argument("--part", choices=("decode", "train"), help=argparse.SUPPRESS)
    parser.add_argument("--part_out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.markdown_from:
        report = json.loads(Path(args.markdown_from).read_text())
        Path(args.markdown_from).with_suffix(".md").write_text(markdown(report))
        return
    size = sizes(args.quick, args.repeats)
    if args.part:
        result = run_part(args.part, args.model, size, args.skip_profile)
        Path(args.part_out).write_text(json.dumps(result))
        return
    load_before = os.getloadavg()
    started = time.time()
    print(f"load average before: {load_before}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model
        if args.quick:
            model_path = truncated_copy(args.model, QUICK_LAYERS, os.path.join(tmp, "model"))
        parts = {}
        for part in ("decode", "train"):
            part_out = os.path.join(tmp, f"{part}.json")
            command = [sys.executable, os.path.abspath(__file__), "--part", part, "--part_out",
                       part_out, "--model", model_path, "--repeats", str(args.repeats)]
            command += ["--quick"] * args.quick + ["--skip_profile"] * args.skip_profile
            subprocess.run(command, check=True)
            parts[part] = json.loads(Path(part_out).read_text())
    train_part_result = parts["train"]
    report = dict(
        model=dict(path=os.path.relpath(args.model, ROOT) + (
            f" (first {QUICK_LAYERS} layers)" if args.quick else ""),
            **train_part_result["model"]),
        text=parts["decode"]["text"],
        decode=parts["decode"]["decode"], train=train_part_result["train"],
        profile=train_part_result["profile"],
        environment=dict(cpu=_cpu_model(), cores=os.cpu_count(), torch_threads=os.cpu_count(),
                         omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
                         jax=jax.__version__, torch=torch.__version__,
                         transformers=transformers.__version__, jax_backend=jax.default_backend(),
                         commit=_git_head(),
                         date=datetime.datetime.now(datetime.timezone.utc).strftime(
                             "%Y-%m-%d %H:%M UTC"),
                         load_average_before=load_before, load_average_after=os.getloadavg(),
                         peak_rss_gib={p: r["peak_rss_gib"] for p, r in parts.items()},
                         wall_s=time.time() - started),
        settings=dict(repeats=size["repeats"], timing="best of repeats after a warm-up, the "
                      "two sides' repeats interleaved; each part in a child process",
                      command="python benchmarks/smollm2.py" + " --quick" * args.quick))
    print(f"load average after: {report['environment']['load_average_after']}, "
          f"{report['environment']['wall_s']:.0f}s", flush=True)
    if args.quick:
        print(markdown(report))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "smollm2_bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "smollm2_bench.md").write_text(markdown(report))


def _gemm_groups(mm, vocab) -> str:
    """The GEMM rates of the decoder layers' projections and of the LM head, each side."""
    if not mm.get("shapes"):
        return ""
    parts = []
    for name, is_head in (("the layers' projections", False), ("the LM head", True)):
        group = [g for g in mm["shapes"] if (vocab in (g["m"], g["k"], g["n"])) == is_head]
        flops = sum(2 * g["m"] * g["k"] * g["n"] * g["count"] for g in group)
        rate = {side: flops / sum(g["count"] * 2 * g["m"] * g["k"] * g["n"] / g[f"{side}_gflop_s"]
                                  for g in group) for side in ("ours", "torch")}
        parts.append(f"{name} {rate['ours']:.0f} vs {rate['torch']:.0f}")
    return " (" + "; ".join(parts) + ", GFLOP/s ours vs PyTorch)"


def _load(triple):
    return "/".join(f"{x:.2f}" for x in triple)


def markdown(r) -> str:
    env, train, m = r["environment"], r["train"], r["model"]
    lines = [
        "# SmolLM2-135M-Instruct: our sampler and train step vs transformers / PyTorch",
        "",
        f"measured on: {env['cpu']}, {env['cores']} cores, commit {env['commit']}, {env['date']}, "
        f"command: {r['settings']['command']}",
        "",
        f"Load average (1/5/15 min) before: {_load(env['load_average_before'])}, after: "
        f"{_load(env['load_average_after'])}. This machine is shared: other engineers run tests "
        "on it at the same time, so both sides' times include their load; each part interleaves "
        "the two sides' repeats so that it hits both alike, and every time is the best of "
        f"{r['settings']['repeats']} after a warm-up. Whole run {env['wall_s'] / 60:.1f} min.",
        "",
        f"Model: {m['path']} (Llama family, {m['layers']} layers, width {m['hidden']}, "
        f"{m['heads']} query / {m['kv_heads']} KV heads, vocab {m['vocab']:,}, tied embeddings, "
        f"{m['params'] / 1e6:.1f}M parameters), float32 on both sides, the same weights. "
        f"jax {env['jax']} (XLA:CPU, all cores), torch {env['torch']} with "
        f"`torch.set_num_threads({env['torch_threads']})` and OMP_WAIT_POLICY="
        f"{env['omp_wait_policy']} (libgomp's default spin-waiting made 2 torch threads 3-4x "
        "slower under this machine's other load), transformers "
        f"{env['transformers']} (sdpa attention). Text: {r['text']['source']} ({r['text']['tokens']:,} tokens with "
        "the model's tokenizer), cut into equal-length windows.",
        "",
        "## 1. Decode: `matpo_jax.sampler.loop.generate` vs transformers `generate`",
        "",
        "Greedy, KV cache, the same prompts (no padding), every row decoded to the full length "
        "(no EOS on either side, nothing masked). Time = the whole call (prefill + decode). "
        "Prefill = the same call with 1 new token; decode ms/step = (whole - prefill) / "
        "(new tokens - 1). Identical rows: rows whose new tokens are all equal on both sides.",
        "",
        "| batch | prompt | new | ours tok/s | transformers tok/s | ours / transformers | "
        "ours prefill (s) | theirs prefill (s) | ours decode ms/step | theirs decode ms/step | "
        "identical rows | our compile + first call (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d in r["decode"]:
        lines.append(
            f"| {d['batch']} | {d['prompt_len']} | {d['new_tokens']} | {d['ours_tok_s']:.1f} | "
            f"{d['hf_tok_s']:.1f} | **{d['speedup']:.2f}x** | {d['ours_prefill_s']:.2f} | "
            f"{d['hf_prefill_s']:.2f} | {d['ours_decode_ms_per_token_step']:.1f} | "
            f"{d['hf_decode_ms_per_token_step']:.1f} | {d['greedy_identical_rows']:.0%} | "
            f"{d['ours_compile_and_first_run_s']:.1f} |")
    lines += [
        "",
        "## 2. Train step: ours (packed, SFT cross-entropy) vs PyTorch (LlamaForCausalLM + AdamW)",
        "",
        f"{train['sequences']} sequences of {min(train['lengths'])}-{max(train['lengths'])} "
        f"tokens ({train['tokens']:,} tokens, {train['loss_tokens']:,} scored), packed into "
        f"{train['rows']} rows x {train['row_len']} (efficiency {train['efficiency']:.3f}); "
        "PyTorch gets the same rows with position ids restarting per sequence (transformers "
        "builds the block-diagonal causal mask for sdpa from them), labels -100 where our loss "
        "mask is 0. Loss: token-mean cross-entropy on both sides (ours: the SFT objective with "
        "LossConfig loss_agg='token-mean'; theirs: the labels loss). AdamW lr 1e-5, wd 0.01, "
        "global-norm clip 1.0; the whole batch in one micro-batch on both sides. Step = forward "
        "+ backward + update; forward = the loss alone (no gradient).",
        "",
        "| side | step (s) | trained tokens/s | forward (s) | loss before the update | "
        "compile (s) |",
        "|---|---:|---:|---:|---:|---:|",
        f"| ours | {train['ours_step_s']:.2f} | {train['ours_tokens_per_s']:.1f} | "
        f"{train['ours_forward_s']:.2f} | {train['ours_loss_before_update']:.6f} | "
        f"{train['ours_compile_s']:.1f} |",
        f"| PyTorch | {train['torch_step_s']:.2f} | {train['torch_tokens_per_s']:.1f} | "
        f"{train['torch_forward_s']:.2f} | {train['torch_loss_before_update']:.6f} | - |",
        "",
        f"- ours / PyTorch trained tokens/s: **{train['speedup']:.2f}x**",
        f"- loss before the update: |ours - PyTorch| = {train['loss_abs_diff']:.2e} "
        f"({train['loss_rel_diff']:.1e} relative); the next steps' losses (the same batch "
        f"again, after each side's own updates): ours "
        f"{', '.join(f'{x:.4f}' for x in train['ours_losses'][1:4])}, PyTorch "
        f"{', '.join(f'{x:.4f}' for x in train['torch_losses'][1:4])}",
    ]
    p = r.get("profile")
    if p:
        mm, att = p["matmuls"], p["attention"]
        lines += [
            "",
            "## 3. Where the time goes",
            "",
            f"Each ingredient timed alone on each side at the train step's shapes ({p['gemm_tokens']:,} "
            "row positions, padding included): the weight GEMMs (every projection's forward, "
            "input-gradient and weight-gradient product x layers, and the tied LM head's three, "
            f"{mm['flops'] / 1e12:.2f} TFLOP) and the causal within-segment attention (forward + "
            "backward x layers; ours: packed_attention, theirs: sdpa with the block-diagonal "
            "mask).",
            "",
            "| ingredient | ours (s) | PyTorch (s) | ours / PyTorch time |",
            "|---|---:|---:|---:|",
            f"| weight GEMMs | {mm['ours']:.2f} | {mm['torch']:.2f} | "
            f"{mm['ours'] / mm['torch']:.2f} |",
            f"| attention fwd + bwd | {att['ours']:.2f} | {att['torch']:.2f} | "
            f"{att['ours'] / att['torch']:.2f} |",
            f"| whole step | {train['ours_step_s']:.2f} | {train['torch_step_s']:.2f} | "
            f"{train['ours_step_s'] / train['torch_step_s']:.2f} |",
            f"| forward only | {train['ours_forward_s']:.2f} | {train['torch_forward_s']:.2f} | "
            f"{train['ours_forward_s'] / train['torch_forward_s']:.2f} |",
            "",
            f"GEMM rate: ours {mm['flops'] / mm['ours'] / 1e9:.0f} GFLOP/s, PyTorch "
            f"{mm['flops'] / mm['torch'] / 1e9:.0f} GFLOP/s" + _gemm_groups(mm, m["vocab"]) + ".",
        ]
        if p.get("xla_ops"):
            x = p["xla_ops"]
            lines += ["", "Our step's XLA:CPU thunks by kind (jax.profiler, self time): " +
                      ", ".join(f"{k} {v:.0%}" for k, v in sorted(x["share"].items(),
                                                               key=lambda kv: -kv[1])) + "."]
        t = p["torch_ops"]
        lines += ["", "PyTorch step by operator (torch.profiler, self CPU time): matmul "
                  f"{t['share']['matmul']:.0%}, attention kernels {t['share']['attention']:.0%}; "
                  "top: " + ", ".join(f"{o['op']} {o['self_cpu_s']:.2f}s" for o in t["top"][:6])
                  + "."]
    if r.get("findings"):
        lines += ["", "### Findings", ""]
        for paragraph in r["findings"]:
            lines += [paragraph, ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
