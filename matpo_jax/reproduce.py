"""Miniature reproduction of the paper's comparison: single-agent GRPO vs MATPO (and the recap and
final-summary ablations, and MATPO's successors' credit rules) at several noise levels and seeds,
from the same warm start with the same SFT and RL budgets; writes a markdown table, the bars it
checks, and validation curves.

    python -m matpo_jax.reproduce --out=docs/repro                         # the full grid
    python -m matpo_jax.reproduce --out=/tmp/r --noise=0.6 --seeds=0 --variants=matpo,single

Per method and noise level, one SFT-only run (`train.steps=0`) learns that method's way of
working from demonstrations written in its own prompt format (configs/synthetic_repro.py); each
seed then starts RL from its checkpoint (`sft.init_checkpoint`); the successors (agent_norm,
setwise), which change only the credit rule, start from MATPO's. The first seed evaluates the
shared SFT start; the other seeds take that evaluation (the same parameters, greedy decoding)
instead of repeating it. Every run is `python -m matpo_jax.train` in its own workdir, so an
interrupted grid resumes: finished runs are skipped, a killed one continues from its last
checkpoint, and a run still going in another process (a grid stopped and started again) is
waited for, not started twice. The compared methods run first, seed by seed, the others after, in
the order of --variants.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys

import numpy as np
from absl import app, flags

from matpo_jax.report import compare
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.run import workdir_lock
from matpo_jax.run.job_graph import Job, run_jobs

_OUT = flags.DEFINE_string("out", "docs/repro", "Where runs, table and plots go.")
_NOISE = flags.DEFINE_list("noise", ["0.05", "0.6"], "Noise levels of the world (low first).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "RL seeds per setting.")
_VARIANTS = flags.DEFINE_list("variants", ["single", "matpo", "agent_norm", "setwise",
                                           "matpo_no_recap", "matpo_no_summary"],
                              "Methods to run (VARIANTS).")
_ABLATIONS_AT = flags.DEFINE_list("ablations_at", ["0.6"],
                                  "Noise levels where the variants beyond single and matpo run "
                                  "(each costs a run per seed, an ablation also an SFT).")
_ABLATION_SEEDS = flags.DEFINE_list("ablation_seeds", None,
                                    "Seeds of the variants beyond single and matpo "
                                    "(default: --seeds).")
_OVERRIDES = flags.DEFINE_string("overrides", "", "Extra config overrides for every run (a=b,c=d).")
_PARALLEL = flags.DEFINE_integer("parallel", 2, "Runs at once (each is its own process).")

@dataclasses.dataclass(frozen=True)
class Variant:
    """One method of the grid: its synthetic_repro arguments, its RL options, and whose SFT start
    it shares (None: its own SFT, on demonstrations in its own prompt format). `over_sft`: RL
    trains adapters over that SFT result as the frozen base (exported in Hugging Face layout),
    instead of restoring it as the trained parameters (LoRA)."""

    arg: str
    rl: tuple[str, ...] = ()
    sft_of: str | None = None
    over_sft: bool = False


# Rank-16 adapters on all seven projections (docs/lora.md), trained in RL over MATPO's SFT result,
# with MATPO's RL budget and learning rate. (Adapters cannot learn the protocol in SFT from the
# reading warm start: its embeddings and head, which they leave frozen, never saw the protocol's
# tokens; 1,000 SFT steps ended at loss 1.2 against full fine-tuning's 0.006, and 0.0%.)
LORA = ("model.lora.rank=16", "model.lora.alpha=32")


VARIANTS = {
    "single": Variant("mode=single"),
    "matpo": Variant("mode=matpo"),
    # The prompt-format ablations: each its own SFT, so they measure the mechanism, not a mismatch.
    "matpo_no_recap": Variant("mode=matpo,recap=false"),
    "matpo_no_summary": Variant("mode=matpo,summary=false"),
    # MATPO's successors (docs/METHOD.md 4.5, 5.1): the same rollouts and SFT start as MATPO, only
    # the credit rule differs, so they start RL from MATPO's SFT checkpoint.
    "agent_norm": Variant("mode=matpo", rl=("rl.group_by=agent",), sft_of="matpo"),
    "setwise": Variant("mode=matpo", rl=("rl.ratio=setwise",), sft_of="matpo"),
    # Full fine-tuning vs LoRA (issue 50): one shared adapter, or one per role.
    "matpo_lora": Variant("mode=matpo", rl=LORA, sft_of="matpo", over_sft=True),
    "matpo_lora_per_role": Variant("mode=matpo", rl=LORA + ("model.lora.roles=per_role",),
                                   sft_of="matpo", over_sft=True),
}
COMPARED = ("single", "matpo")  # run at every noise level and seed; the rest only at ablations_at
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The bars the issue sets for the comparison at the highest noise level.
MIN_GAP_POINTS, MIN_GAP_IN_POOLED_SD = 5.0, 2.0
SHARED_EVAL_FILES = ("sft.json", "sft_samples.txt", "sft_questions.jsonl")
# The variants that change only the RL update: compared with the two methods in their own table.
SUCCESSORS = tuple(name for name, variant in VARIANTS.items()
                   if variant.rl and not variant.over_sft)
# The prompt-format ablations (their own SFT, MATPO's RL): compared with MATPO in their own table.
ABLATIONS = tuple(name for name, variant in VARIANTS.items()
                  if name not in COMPARED and not variant.sft_of and not variant.rl)
# The LoRA variants (RL of adapters over MATPO's SFT result): compared with MATPO.
LORA_VARIANTS = tuple(name for name, variant in VARIANTS.items() if variant.over_sft)


def variants_at(noise: str, variants, ablations_at) -> list[str]:
    """The methods run at this noise level: the two compared methods everywhere, ablations only
    at the `ablations_at` noise levels."""
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    return [v for v in variants if v in COMPARED or noise in ablations_at]


def seeds_of(variant: str, seeds, ablation_seeds) -> list[str]:
    """The seeds a method runs: ablations may run fewer (`--ablation_seeds`)."""
    if variant in COMPARED or ablation_seeds is None:
        return list(seeds)
    return list(ablation_seeds)


def sft_name(variant: str, noise: str) -> str:
    return f"sft_{variant}_noise{noise}"


def rl_name(variant: str, noise: str, seed: str) -> str:
    return f"{variant}_noise{noise}_seed{seed}"


def _train_command(workdir: str, arg: str, overrides: list[str]) -> list[str]:
    config = os.path.join(REPO, "configs", "synthetic_repro.py")
    return ([sys.executable, "-m", "matpo_jax.train", f"--config={config}:{arg}",
             f"--workdir={workdir}"] + [f"--config.{kv}" for kv in overrides if kv])


def _finished(workdir: str) -> bool:
    return os.path.exists(os.path.join(workdir, "summary.json"))


def _world_built(runs: str, noise: str) -> bool:
    """Whether a finished SFT at this noise level (of any variant) has built its world: later
    grids then start their SFTs together instead of one after another."""
    return any(_finished(os.path.join(runs, sft_name(v, noise)))
               for v, spec in VARIANTS.items() if not spec.sft_of)


def _copy_shared_eval(source: str, target: str) -> None:
    """The SFT start's evaluation from the run that made it (the same parameters)."""
    os.makedirs(os.path.join(target, "eval"), exist_ok=True)
    for name in SHARED_EVAL_FILES:
        src, dst = os.path.join(source, "eval", name), os.path.join(target, "eval", name)
        if os.path.exists(src) and not os.path.exists(dst):
            shutil.copyfile(src, dst)


def export_name(variant: str, noise: str) -> str:
    """The job (and folder under runs/) that exports a variant's SFT result as a base."""
    return f"{sft_name(variant, noise)}_hf"


def _exported(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, "export.json"))


def sft_source(variant: str) -> str:
    """The variant whose SFT checkpoint this variant starts RL from."""
    return VARIANTS[variant].sft_of or variant


def plan(out: str, noises, seeds, variants, ablations_at, ablation_seeds,
         overrides: list[str]) -> list[Job]:
    """The grid as jobs in priority order: the compared methods before the others, and within
    each, seed by seed (every method and noise level of the first seed, then of the second...),
    so a grid stopped early has whole comparisons over fewer seeds, not some methods missing."""
    runs = os.path.join(out, "runs")
    settings = [(v, n) for n in noises for v in variants_at(n, variants, ablations_at)]
    for variant, noise in settings:
        if (sft_source(variant), noise) not in settings:
            raise ValueError(f"--variants: {variant} starts from {sft_source(variant)}'s SFT, "
                             f"which does not run at noise {noise}; add it to --variants")
    jobs, world_maker = [], {}  # the first SFT at a noise level builds its world's dataset
    for group in ([s for s in settings if s[0] in COMPARED],
                  [s for s in settings if s[0] not in COMPARED]):
        for variant, noise in group:
            if VARIANTS[variant].sft_of:
                continue  # starts from another variant's SFT
            workdir = os.path.join(runs, sft_name(variant, noise))
            after = (world_maker[noise],) if noise in world_maker else ()
            if not _world_built(runs, noise):
                world_maker.setdefault(noise, sft_name(variant, noise))
            jobs.append(Job(sft_name(variant, noise),
                            _train_command(workdir, f"{VARIANTS[variant].arg},noise={noise},seed=0",
                                           overrides + ["train.steps=0"]),
                            log_path=workdir + ".log", after=after,
                            done=lambda w=workdir: _finished(w),
                            busy=lambda w=workdir: workdir_lock.is_held(w)))
        rl_jobs = []
        for variant, noise in group:
            source = sft_source(variant)
            start = os.path.join(os.path.abspath(runs), sft_name(source, noise),
                                 "checkpoints", "sft")
            starting = [f"sft.init_checkpoint={start}"]
            after = (sft_name(source, noise),)
            if VARIANTS[variant].over_sft:
                # The SFT result as a frozen base: exported once, then every RL run of such a
                # variant loads it as its model (no SFT of its own; adapters start at zero, so
                # its SFT start is the source's, evaluation included).
                base = os.path.join(os.path.abspath(runs), export_name(source, noise))
                if not any(j.name == export_name(source, noise) for j in jobs):
                    jobs.append(Job(export_name(source, noise),
                                    [sys.executable, "-m", "matpo_jax.export",
                                     f"--checkpoint={start}", f"--out={base}"],
                                    log_path=base + ".log", after=after,
                                    done=lambda d=base: _exported(d)))
                starting = [f"model.hf_checkpoint={base}", "model.hf_checkpoint_sha256=",
                            "sft.steps=0", "sft.copy_steps=0"]
                after = (export_name(source, noise),)
            # The run that evaluates the SFT start: the source's first seed; the others copy it.
            first = rl_name(source, noise, seeds_of(source, seeds, ablation_seeds)[0])
            for rank, seed in enumerate(seeds_of(variant, seeds, ablation_seeds)):
                name = rl_name(variant, noise, seed)
                workdir = os.path.join(runs, name)
                share, waits = None, after
                if name != first:
                    waits += (first,)
                    share = lambda s=os.path.join(runs, first), t=workdir: (  # noqa: E731
                        _copy_shared_eval(s, t))
                rl_jobs.append((rank, Job(
                    name,
                    _train_command(workdir, f"{VARIANTS[variant].arg},noise={noise},seed={seed}",
                                   overrides + starting + list(VARIANTS[variant].rl)),
                    log_path=workdir + ".log", after=waits, before_start=share,
                    done=lambda w=workdir: _finished(w),
                    busy=lambda w=workdir: workdir_lock.is_held(w))))
        jobs += [job for _, job in sorted(rl_jobs, key=lambda pair: pair[0])]  # stable
    return jobs


def _percent(runs: list[dict], phase: str, key: str) -> np.ndarray:
    return np.array([100 * r[phase].get(key, float("nan")) for r in runs])


def _context_cell(runs: list[dict]) -> str:
    """How full the context that holds the tool output got after RL: the single agent's, or a
    MATPO worker's (mean tokens, and the share of those rollouts stopped by the limit)."""
    role = "single" if any("eval/rollouts/single" in r["final_eval"] for r in runs) else "worker"
    tokens = [r["final_eval"].get(f"eval/context_tokens_mean/{role}", float("nan")) for r in runs]
    stopped = [r["final_eval"].get(f"eval/finish_max_context_frac/{role}", 0.0) for r in runs]
    return f"{role}: {np.mean(tokens):.0f} tokens, {100 * np.mean(stopped):.0f}% at the limit"


def table(results: dict, noises, hops_keys) -> str:
    head = ("| noise | method | accuracy | " + " | ".join(k.split("_")[-1] for k in hops_keys)
            + " | context after RL |")
    lines = [head, "|" + "---|" * (4 + len(hops_keys))]
    for noise in noises:
        for variant, runs in results[noise].items():
            cells = []
            for key in ["eval/accuracy", *hops_keys]:
                values = _percent(runs, "final_eval", key)
                cells.append(f"{np.mean(values):.1f} ± {np.std(values):.1f}")
            sft = np.mean(_percent(runs, "sft_eval", "eval/accuracy"))
            lines.append(f"| {noise} | {variant} (SFT start {sft:.1f}; {len(runs)} seeds) | "
                         + " | ".join(cells) + f" | {_context_cell(runs)} |")
    return "\n".join(lines)


def training_stats(workdir: str) -> dict[str, float]:
    """What the successors and the LoRA variants claim to change, from one run's RL steps
    (metrics.jsonl): the rollout reward of its last 5 steps, the gradient-norm spikes (> 3x the
    running median, METHOD 11), the largest gradient norm, the share of clipped tokens per role,
    the mean gradient norm of each role's tokens (`rl.role_grad_norms`) and the median seconds
    of a step's rollouts and update."""
    # One record per step: a resumed run's redone steps count once.
    steps = [row for row in metrics_lib.load_metrics(os.path.join(workdir, "metrics.jsonl"))
             if "loss" in row]
    if not steps:
        return {}
    stats = {"reward_last5": float(np.mean([r["reward/mean"] for r in steps[-5:]])),
             "grad_norm_spikes": float(steps[-1].get("grad_norm_spikes", float("nan"))),
             "grad_norm_max": float(max(r["grad_norm"] for r in steps))}
    for role in ("planner", "worker"):  # the single agent logs as the planner
        fracs = [r[f"{role}/clip_frac"] for r in steps if f"{role}/clip_frac" in r]
        if fracs:
            stats[f"clip_frac/{role}"] = float(np.mean(fracs))
        norms = [r[f"{role}/grad_norm"] for r in steps if f"{role}/grad_norm" in r]
        if norms:
            stats[f"grad_norm/{role}"] = float(np.mean(norms))
    for phase in ("rollout", "update"):
        seconds = [r[f"time_{phase}_s"] for r in steps if f"time_{phase}_s" in r]
        if seconds:
            stats[f"step_s/{phase}"] = float(np.median(seconds))
    return stats


def stability_table(results: dict, noise: str) -> str:
    """Per method at one noise level: test accuracy, final rollout reward, gradient-norm spikes
    and the largest norm, clipped tokens per role, each role's mean gradient norm, and a step's
    seconds of rollouts and update (mean ± sd over seeds)."""
    lines = ["| method | accuracy | reward, last 5 steps | grad-norm spikes | largest grad norm "
             "| clipped tokens (planner / worker) | grad norm (planner / worker) | step s "
             "(rollouts / update) |", "|---|---|---|---|---|---|---|---|"]
    for variant, runs in results.get(noise, {}).items():
        stats = [training_stats(r["workdir"]) for r in runs]
        acc = _percent(runs, "final_eval", "eval/accuracy")

        def cell(key, scale=1.0, digits=2):
            values = scale * np.array([s.get(key, float("nan")) for s in stats])
            return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"
        clip = " / ".join(cell(f"clip_frac/{role}", 100, 1) + "%"
                          for role in ("planner", "worker")
                          if any(f"clip_frac/{role}" in s for s in stats))
        def pair(prefix, names, digits):
            cells = [cell(f"{prefix}/{name}", digits=digits) for name in names
                     if any(f"{prefix}/{name}" in s for s in stats)]
            return " / ".join(cells) or "-"
        lines.append(f"| {variant} ({len(runs)} seeds) | {np.mean(acc):.1f} ± {np.std(acc):.1f} | "
                     f"{cell('reward_last5')} | {cell('grad_norm_spikes', digits=1)} | "
                     f"{cell('grad_norm_max')} | {clip or '-'} | "
                     f"{pair('grad_norm', ('planner', 'worker'), 3)} | "
                     f"{pair('step_s', ('rollout', 'update'), 1)} |")
    return "\n".join(lines)


def seed_of(run: dict) -> str:
    """The RL seed of a finished run, from its workdir's name (`rl_name`)."""
    return os.path.basename(os.path.normpath(run["workdir"])).rsplit("_seed", 1)[1]


def per_seed_table(results: dict, noise: str, seeds, start: bool = False) -> str:
    """Per method at one noise level: test accuracy of each seed, mean ± sd over the seeds run,
    and each seed's difference from MATPO's run of the same seed (the same question stream).
    start: also the method's SFT start (one per method) and the mean gain over it (methods
    with SFTs of their own, such as the ablations)."""
    methods = results.get(noise, {})
    matpo = {seed_of(r): 100 * r["final_eval"]["eval/accuracy"] for r in methods.get("matpo", [])}
    head = ["method"] + (["SFT start"] if start else []) + [f"seed {s}" for s in seeds] \
        + ["mean ± sd"] + (["gain"] if start else []) + ["matched seeds: minus MATPO"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for variant, runs in methods.items():
        accuracy = {seed_of(r): 100 * r["final_eval"]["eval/accuracy"] for r in runs}
        values = np.array(list(accuracy.values()))
        matched = ", ".join(f"{accuracy[s] - matpo[s]:+.1f}" for s in seeds
                            if s in accuracy and s in matpo)
        sft = float(np.mean(_percent(runs, "sft_eval", "eval/accuracy"))) if start else 0.0
        cells = ([variant] + ([f"{sft:.1f}"] if start else [])
                 + [f"{accuracy[s]:.1f}" if s in accuracy else "not run" for s in seeds]
                 + [f"{values.mean():.1f} ± {values.std():.1f}"]
                 + ([f"{values.mean() - sft:+.1f}"] if start else [])
                 + ["-" if variant == "matpo" else matched or "-"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gaps(results: dict, noises) -> dict[str, dict]:
    """MATPO minus single agent after RL at each noise level with both: the mean gap in points
    and the pooled standard deviation of the seeds (population sd, as the table)."""
    out = {}
    for noise in noises:
        runs = results.get(noise, {})
        if not all(runs.get(v) for v in COMPARED):
            continue
        matpo = _percent(runs["matpo"], "final_eval", "eval/accuracy")
        single = _percent(runs["single"], "final_eval", "eval/accuracy")
        out[noise] = {"gap": float(matpo.mean() - single.mean()),
                      "pooled_sd": float(np.sqrt((matpo.var() + single.var()) / 2))}
    return out


def bars(gap_by_noise: dict[str, dict], noises) -> list[str]:
    """The issue's bars, each stated as met or not."""
    measured = [n for n in noises if n in gap_by_noise]
    if not measured:
        return ["- no noise level has both compared methods yet"]
    high, low = measured[-1], measured[0]
    g = gap_by_noise[high]
    lines = [f"- MATPO - single at noise {high}: {g['gap']:+.1f} points (bar: >= "
             f"{MIN_GAP_POINTS:.0f}): **{'met' if g['gap'] >= MIN_GAP_POINTS else 'not met'}**",
             f"- the same gap in pooled seed sd: {g['gap']:+.1f} vs {MIN_GAP_IN_POOLED_SD:.0f} x "
             f"{g['pooled_sd']:.1f} (bar: >= {MIN_GAP_IN_POOLED_SD:.0f} x): **"
             + ("met" if 0 < g["gap"] >= MIN_GAP_IN_POOLED_SD * g["pooled_sd"] else "not met")
             + "**"]
    if low != high:
        gl = gap_by_noise[low]["gap"]
        lines.append(f"- the gap grows with noise: {gl:+.1f} at {low} -> {g['gap']:+.1f} at "
                     f"{high}: **{'met' if g['gap'] > gl else 'not met'}**")
    return lines


def collect(out: str, noises, seeds, variants, ablations_at, ablation_seeds) -> dict:
    """{noise: {variant: [summary of each finished seed]}}."""
    results = {}
    for noise in noises:
        results[noise] = {}
        for variant in variants_at(noise, variants, ablations_at):
            summaries = []
            for seed in seeds_of(variant, seeds, ablation_seeds):
                path = os.path.join(out, "runs", rl_name(variant, noise, seed), "summary.json")
                if os.path.exists(path):
                    with open(path) as f:
                        summary = json.load(f)
                    # Where the run is now: a grid's folder may have moved since it ran.
                    summary["workdir"] = os.path.dirname(os.path.abspath(path))
                    summaries.append(summary)
            if summaries:
                results[noise][variant] = summaries
    return results


def comparison_sections(out: str, results: dict, baselines, variants, name: str, *,
                        title: str, heading: str, intro: str, start: bool) -> list[str]:
    """table.md's section comparing `variants` with `baselines` at each noise level that ran
    one of them: per-seed and training tables, and the figure `<name>_noise<noise>.png`."""
    sections = []
    for noise in _NOISE.value:
        methods = {v: runs for v, runs in results[noise].items()
                   if v in baselines or v in variants}
        if not set(methods) & set(variants):
            continue
        figure = os.path.join(out, f"{name}_noise{noise}.png")
        compare.plot_comparison(
            {v: [os.path.join(s["workdir"], "metrics.jsonl") for s in runs]
             for v, runs in methods.items()}, figure,
            keys=("curve/accuracy", "reward/mean", "grad_norm"), smoothing=0.5,
            title=f"noise {noise}: {title} (mean ± sd over seeds)")
        sections += [f"## {heading} at noise {noise}", "", intro, "",
                     "Test accuracy (%) per seed:", "",
                     per_seed_table({noise: methods}, noise, _SEEDS.value, start=start), "",
                     "Training, per method (mean ± sd over seeds):", "",
                     stability_table({noise: methods}, noise), "",
                     f"Curves: `{os.path.basename(figure)}`.", ""]
    return sections


def grid_command(out: str, noise, seeds, variants, ablations_at, ablation_seeds=None,
                 overrides: str = "") -> str:
    """The command line that reruns this grid (for the table's header): every flag that shaped
    the runs, overrides included."""
    command = (f"python -m matpo_jax.reproduce --out={out} --noise={','.join(noise)} "
               f"--seeds={','.join(seeds)} --variants={','.join(variants)} "
               f"--ablations_at={','.join(ablations_at)}")
    if ablation_seeds:
        command += f" --ablation_seeds={','.join(ablation_seeds)}"
    if overrides:
        command += f" --overrides='{overrides}'"
    return command


def main(argv):
    del argv
    out = _OUT.value
    os.makedirs(out, exist_ok=True)
    # One world (dataset, corpus) per noise level, shared by every run at that level.
    shared = f"data.data_dir={os.path.abspath(os.path.join(out, 'tfds'))}"
    overrides = [kv for kv in _OVERRIDES.value.split(",") if kv] + [shared]
    grid = (_NOISE.value, _SEEDS.value, _VARIANTS.value, _ABLATIONS_AT.value,
            _ABLATION_SEEDS.value)
    jobs = plan(out, *grid, overrides)
    print(f"reproduce: {len(jobs)} runs, {_PARALLEL.value} at a time; logs beside each workdir "
          f"in {os.path.join(out, 'runs')}")
    failed = run_jobs(jobs, parallel=_PARALLEL.value, cwd=REPO)
    results = collect(out, *grid)
    for noise in _NOISE.value:
        methods = results[noise]
        if methods:
            dirs = {v: [os.path.join(s["workdir"], "metrics.jsonl") for s in runs]
                    for v, runs in methods.items()}
            compare.compare_runs(dirs, os.path.join(out, f"curves_noise{noise}.png"),
                                 band="sd", title=f"noise {noise}: test accuracy (96-question "
                                 "curve) and rollout reward; mean ± sd over seeds")
    successor_sections = comparison_sections(
        out, results, COMPARED, SUCCESSORS, "successors",
        title="MATPO's credit rule and its successors'",
        heading="MATPO and its successors", start=False,
        intro="Same SFT start as MATPO and the same RL budget; agent_norm: `rl.group_by=agent` "
              "(Dr. MAS), setwise: `rl.ratio=setwise` (SRPO).")
    ablation_sections = comparison_sections(
        out, results, ("matpo",), ABLATIONS, "ablations",
        title="MATPO and its prompt-format ablations",
        heading="The recap and final-summary ablations", start=True,
        intro="Each from SFT on its own prompt format (the same SFT budget), then MATPO's RL "
              "budget and question stream. matpo_no_recap: `rollout.user_query_recap=false`, "
              "matpo_no_summary: `rollout.final_summary=false`. Gain: mean after RL minus the "
              "SFT start.")
    lora_sections = comparison_sections(
        out, results, ("matpo",), LORA_VARIANTS, "lora",
        title="MATPO, full fine-tuning vs LoRA",
        heading="Full fine-tuning vs LoRA adapters", start=True,
        intro="All from MATPO's SFT result (full fine-tuning of the warm start), then MATPO's "
              "RL budget, learning rate and question stream; the LoRA variants train adapters "
              "over that result as the frozen base (exported, `model.hf_checkpoint`). "
              "matpo_lora: one rank-16 adapter on all seven projections (`model.lora.rank=16`, "
              "alpha 32), matpo_lora_per_role: one for the planner and one for the workers "
              "(`model.lora.roles=per_role`); docs/lora.md. Gain: mean after RL minus the SFT "
              "start.")
    hops = sorted({k for n in results.values() for runs in n.values() for r in runs
                   for k in r["final_eval"] if k.startswith("eval/accuracy_hop")})
    gap_by_noise = gaps(results, _NOISE.value)
    command = grid_command(out, _NOISE.value, _SEEDS.value, _VARIANTS.value, _ABLATIONS_AT.value,
                           _ABLATION_SEEDS.value, _OVERRIDES.value)
    text = "\n".join([
        "# Miniature reproduction: single-agent GRPO vs MATPO", "",
        f"Command: `{command}`", "",
        "Test accuracy (%) after RL, mean ± sd over seeds; SFT start = before RL.", "",
        table(results, _NOISE.value, hops), "", "Bars:", *bars(gap_by_noise, _NOISE.value), "",
        *([f"Not finished: {', '.join(f'{k} ({v})' for k, v in sorted(failed.items()))}", ""]
          if failed else []), *successor_sections, *ablation_sections,
          *lora_sections])
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"command": command, "gaps": gap_by_noise, "failed": failed,
                   "runs": {n: {v: [{"sft": r["sft_eval"], "final": r["final_eval"]}
                                    for r in runs] for v, runs in m.items()}
                            for n, m in results.items()}}, f, indent=1, sort_keys=True)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    app.run(main)
