"""GRPO train step side by side: tunix's `grpo` policy loss + optimizer update vs our train step,
on the same token batch, the same weights (one HF directory, each side's loader) and the same
optax optimizer (ours: clip-by-global-norm 1.0 then AdamW, handed to tunix's nnx.Optimizer).

The batch is a GRPO batch: `--prompts` prompts x `--group` completions, prompt lengths 32-64 and
completion lengths 16-128 (ended by EOS early or late), random ids; old log-probs = the initial
policy's log-probs plus noise (so ratios move off 1 and some tokens clip); advantages
group-normalised from random 0/1 rewards. tunix gets it as its learner does: prompts left-padded
to 64, completions right-padded to 128, a completion mask. Ours gets it packed (several sequences
per row, our default) and padded (one per row, tunix's layout) to separate the layout's share.

Shared loss definition: token-level PPO clip (eps 0.2 both ways, no dual clip, no KL term),
`sequence-mean-token-mean` aggregation (each sequence's token mean, averaged over sequences),
temperature 1. tunix: GRPOConfig(beta=0, epsilon=0.2); ours: LossConfig(seq-mean-token-mean,
dual_clip=None, entropy_metrics=False). Agreement is checked on the loss before the first update
and after it (the second says the gradients and the update agree too).

tunix's step is the one its PeftTrainer jits: nnx.value_and_grad of the loss, global norm, then
optimizer.update, under nnx.jit with the optimizer donated.

    python benchmarks/peers/train_step_bench.py [--quick] [--size 30M] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ours_side  # noqa: E402
import tunix_side  # noqa: E402
from matpo_jax import parallel  # noqa: E402
from matpo_jax.rl.advantages import group_advantages  # noqa: E402
from matpo_jax.trainer import loss as loss_lib, packing, step as ts  # noqa: E402
from tunix.rl import algo_core, common as tunix_common  # noqa: E402,F401
from tunix.rl.grpo import grpo_learner  # noqa: E402

PAD, EOS = 0, 1  # ids no random token takes: tokens are drawn from [2, vocab)
PROMPT_MAX, COMPLETION_MAX = 64, 128
# GRPO as tunix computes it: per-sequence token means, averaged over sequences; no KL, no
# entropy term, no dual clip, no correction for the sampler.
LOSS = loss_lib.LossConfig(loss_agg="seq-mean-token-mean", seq_mean_denominator="sequences",
                           loss_agg_norm=0.0, eps_low=0.2, eps_high=0.2, dual_clip_c=None,
                           kl_coef=0.0, kl_type="low_var_kl", entropy_coef=0.0, ratio="token",
                           rollout_correction="off", tis_cap=2.0, entropy_metrics=False)


def grpo_batch(prompts: int, group: int, vocab: int, seed: int, model):
    """The shared batch as (prompt list, completion list, old log-probs list, advantages)."""
    rng = np.random.default_rng(seed)
    rows = []
    advantages = []
    for _ in range(prompts):
        prompt = rng.integers(2, vocab, rng.integers(PROMPT_MAX // 2, PROMPT_MAX + 1))
        advantages += list(group_advantages(rng.integers(0, 2, group).astype(float)))
        for _ in range(group):
            completion = rng.integers(2, vocab, rng.integers(16, COMPLETION_MAX + 1))
            completion[-1] = EOS
            rows.append((prompt.astype(np.int32), completion.astype(np.int32)))
    # Old log-probs: the initial policy's, from a cache-free forward, plus noise.
    old = []
    for prompt, completion in rows:
        tokens = np.concatenate([prompt, completion])
        logits = ours_side.forward_logits(model, tokens[None])[0]
        logp = jax.nn.log_softmax(logits[len(prompt) - 1:-1], -1)
        picked = np.take_along_axis(np.asarray(logp), completion[:, None], -1)[:, 0]
        old.append((picked + rng.normal(0, 0.2, len(completion))).astype(np.float32))
    return rows, old, np.asarray(advantages, np.float32)


def ours_sequences(rows, old, advantages):
    seqs = []
    for i, ((prompt, completion), old_lp) in enumerate(zip(rows, old)):
        tokens = np.concatenate([prompt, completion])
        trainable = np.zeros(len(tokens), bool)
        trainable[len(prompt):] = True
        old_full = np.zeros(len(tokens), np.float32)
        old_full[len(prompt):] = old_lp
        seqs.append(packing.TrainSequence(tokens=tokens, trainable=trainable,
                                          old_logprobs=old_full, advantage=float(advantages[i]),
                                          role_id=0, rollout_id=i, group_id=i))
    return seqs


def tunix_example(rows, old, advantages):
    n = len(rows)
    prompt_ids = np.full((n, PROMPT_MAX), PAD, np.int32)
    completion_ids = np.full((n, COMPLETION_MAX), PAD, np.int32)
    completion_mask = np.zeros((n, COMPLETION_MAX), np.int32)
    old_lp = np.zeros((n, COMPLETION_MAX), np.float32)
    for i, ((prompt, completion), lp) in enumerate(zip(rows, old)):
        prompt_ids[i, PROMPT_MAX - len(prompt):] = prompt  # left-padded, as tunix pads prompts
        completion_ids[i, :len(completion)] = completion
        completion_mask[i, :len(completion)] = 1
        old_lp[i, :len(completion)] = lp
    return grpo_learner.TrainExample(
        prompt_ids=jnp.asarray(prompt_ids), prompt_mask=jnp.asarray(prompt_ids != PAD),
        completion_ids=jnp.asarray(completion_ids), completion_mask=jnp.asarray(completion_mask),
        advantages=jnp.asarray(advantages), ref_per_token_logps=None,
        old_per_token_logps=jnp.asarray(old_lp))


class TunixStep:
    """tunix's jitted train step over its own model and an nnx.Optimizer of our optax chain."""

    def __init__(self, path, tx, group):
        self.model = tunix_side.load(path)
        self.optimizer = nnx.Optimizer(self.model, tx, wrt=nnx.Param)
        self.algo = grpo_learner.GRPOConfig(num_generations=group, beta=0.0, epsilon=0.2,
                                            loss_agg_mode="sequence-mean-token-mean")
        self.algo.temperature = 1.0  # the learner sets it from the rollout config

        def loss_fn(model, example):
            return algo_core.grpo_loss_fn(model, example, self.algo, pad_id=PAD, eos_id=EOS)

        def train_step(model, optimizer, example):
            (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, example)
            grad_norm = optax.global_norm(grads)
            optimizer.update(model, grads)
            return loss, grad_norm

        self.jitted = nnx.jit(train_step, donate_argnames=("optimizer",))

    def __call__(self, example):
        loss, grad_norm = self.jitted(self.model, self.optimizer, example)
        return float(loss), float(grad_norm)


class OursStep:
    def __init__(self, path, tx, batch):
        model = ours_side.load(path)
        mesh = parallel.make_mesh(devices=jax.devices()[:1])
        graphdef, self.state, shardings = ts.init_train_state(model, tx, mesh)
        step = ts.make_train_step(graphdef, tx, ts.TrainStepConfig(loss=LOSS), mesh, shardings)
        self.batch = jax.device_put(batch, parallel.batch_sharding(mesh))
        self.compiled = step.jitted.lower(self.state, self.batch).compile()

    def __call__(self, _=None):
        self.state, metrics = self.compiled(self.state, self.batch)
        return float(metrics["loss"]), float(metrics.get("grad_norm", np.nan))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4M model, 2 repeats, writes nothing")
    parser.add_argument("--size", default="30M")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "results"))
    args = parser.parse_args()
    size, repeats = ("4M", 2) if args.quick else (args.size, args.repeats)
    load_before = common.load_average()
    tx = ts.make_optimizer(ts.OptimizerConfig(learning_rate=1e-3))  # big enough to move the loss
    with tempfile.TemporaryDirectory() as tmp:
        path = common.write_checkpoint(size, os.path.join(tmp, size))
        rows, old, advantages = grpo_batch(args.prompts, args.group,
                                           common.SIZES[size]["vocab_size"], 0,
                                           ours_side.load(path))
        seqs = ours_sequences(rows, old, advantages)
        longest = PROMPT_MAX + COMPLETION_MAX
        layouts = dict(
            ours_packed=packing.pack_sequences(seqs, 2 * longest, row_len_multiple=64,
                                               loss_config=LOSS),
            ours_padded=packing.pad_sequences(seqs, longest, loss_config=LOSS))
        example = tunix_example(rows, old, advantages)
        sides = {name: OursStep(path, tx, batch) for name, batch in layouts.items()}
        sides["tunix"] = TunixStep(path, tx, args.group)
        inputs = {name: None for name in layouts} | {"tunix": example}
        # Two steps each from the same weights: the losses before and after one update.
        losses = {name: [side(inputs[name])[0] for _ in range(2)] for name, side in sides.items()}
        times = {name: [] for name in sides}
        for _ in range(repeats):  # interleaved: the machine's other load hits all sides alike
            for name, side in sides.items():
                start = time.perf_counter()
                side(inputs[name])
                times[name].append(time.perf_counter() - start)
    tokens = sum(len(p) + len(c) for p, c in rows)
    loss_tokens = sum(len(c) for _, c in rows)
    step_s = {name: statistics.median(t) for name, t in times.items()}
    result = dict(
        command="make bench-peers  # python benchmarks/peers/train_step_bench.py " + " ".join(sys.argv[1:]),
        environment=dict(jax=jax.__version__, cores=os.cpu_count(), load_before=load_before,
                         load_after=common.load_average(), machine_shared=True),
        setup=dict(size=size, params=common.SIZES[size], prompts=args.prompts, group=args.group,
                   sequences=len(rows), tokens=tokens, loss_tokens=loss_tokens, repeats=repeats,
                   layouts={name: dict(shape=list(b.shape), efficiency=b.efficiency())
                            for name, b in layouts.items()} | {
                       "tunix": dict(shape=[len(rows), PROMPT_MAX + COMPLETION_MAX],
                                     efficiency=tokens / (len(rows) * (PROMPT_MAX + COMPLETION_MAX)))},
                   loss="PPO clip eps 0.2, no dual clip, no KL, seq-mean-token-mean, T=1",
                   optimizer="clip_by_global_norm(1.0) + AdamW(lr 1e-3, wd 0.01 on matrices)"),
        losses_first_two_steps=losses,
        loss_diff_step1=abs(losses["tunix"][0] - losses["ours_packed"][0]),
        loss_diff_step2=abs(losses["tunix"][1] - losses["ours_packed"][1]),
        step_s=step_s, all_step_s=times,
        tokens_per_s={name: tokens / s for name, s in step_s.items()},
        speedup_packed=step_s["tunix"] / step_s["ours_packed"],
        speedup_padded=step_s["tunix"] / step_s["ours_padded"])
    print(json.dumps({k: v for k, v in result.items() if k != "all_step_s"}, indent=1), flush=True)
    if args.quick:
        return
    common.write_results(args.out, "peers_train_step", result, markdown(result))


def markdown(r):
    s, env = r["setup"], r["environment"]
    lines = [
        "# GRPO train step: matpo_jax vs tunix (same batch, weights, optimizer, loss definition)",
        "",
        f"`{r['command']}`. CPU ({env['cores']} cores, shared: load average {env['load_before']} "
        f"before, {env['load_after']} after), jax {env['jax']}, float32, {s['size']} Qwen3. "
        f"{s['prompts']} prompts x {s['group']} completions = {s['sequences']} sequences, "
        f"{s['tokens']} real tokens ({s['loss_tokens']} trained). Loss: {s['loss']}. "
        f"Optimizer on both sides: {s['optimizer']}. Step time = median of {s['repeats']} "
        "interleaved steps after 2 (compile excluded).",
        "",
        "| side | layout (rows x len, efficiency) | step s | tokens/s | loss step 1 | loss step 2 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name in ("ours_packed", "ours_padded", "tunix"):
        lay = s["layouts"][name]
        lines.append(f"| {name} | {lay['shape'][0]} x {lay['shape'][1]}, {lay['efficiency']:.2f} | "
                     f"{r['step_s'][name]:.3f} | {r['tokens_per_s'][name]:,.0f} | "
                     f"{r['losses_first_two_steps'][name][0]:.6f} | "
                     f"{r['losses_first_two_steps'][name][1]:.6f} |")
    lines += ["", f"tunix / ours step time: **{r['speedup_packed']:.2f}x** (ours packed), "
              f"{r['speedup_padded']:.2f}x (ours padded, tunix's layout). Loss difference "
              f"tunix - ours packed: {r['loss_diff_step1']:.1e} before the first update, "
              f"{r['loss_diff_step2']:.1e} after it."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
