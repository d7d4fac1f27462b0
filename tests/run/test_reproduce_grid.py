"""The reproduction grid's bookkeeping: which methods run where, and the table it writes."""
import pytest

from matpo_jax import reproduce


def test_ablations_run_only_at_their_noise_levels():
    variants = ["single", "matpo", "matpo_no_recap", "matpo_no_summary"]
    assert reproduce.variants_at("0.3", variants, ["0.8"]) == ["single", "matpo"]
    assert reproduce.variants_at("0.8", variants, ["0.8"]) == variants
    with pytest.raises(ValueError, match="matpo_fast"):
        reproduce.variants_at("0.8", ["matpo_fast"], ["0.8"])


def test_ablations_may_run_fewer_seeds():
    assert reproduce.seeds_of("matpo", ["0", "1", "2"], ["0"]) == ["0", "1", "2"]
    assert reproduce.seeds_of("matpo_no_recap", ["0", "1", "2"], ["0"]) == ["0"]
    assert reproduce.seeds_of("matpo_no_recap", ["0", "1"], None) == ["0", "1"]


def test_table_reports_mean_and_std_over_seeds_per_hop():
    def run(acc, hop1, sft, role="single", stopped=0.5):
        return {"final_eval": {"eval/accuracy": acc, "eval/accuracy_hop1": hop1,
                               f"eval/rollouts/{role}": 8, f"eval/context_tokens_mean/{role}": 900,
                               f"eval/finish_max_context_frac/{role}": stopped},
                "sft_eval": {"eval/accuracy": sft}}
    results = {"0.3": {"single": [run(0.1, 0.2, 0.05), run(0.3, 0.4, 0.05)],
                       "matpo": [run(0.5, 0.6, 0.1, role="worker", stopped=0.0)]}}
    lines = reproduce.table(results, ["0.3"], ["eval/accuracy_hop1"]).splitlines()
    assert lines[0].split("|")[1:-1] == [" noise ", " method ", " accuracy ", " hop1 ",
                                         " context after RL "]
    assert lines[2] == ("| 0.3 | single (SFT start 5.0; 2 seeds) | 20.0 ± 10.0 | 30.0 ± 10.0 | "
                        "single: 900 tokens, 50% at the limit |")
    assert lines[3] == ("| 0.3 | matpo (SFT start 10.0; 1 seeds) | 50.0 ± 0.0 | 60.0 ± 0.0 | "
                        "worker: 900 tokens, 0% at the limit |")


def test_repro_config_applies_every_argument():
    from pathlib import Path

    from matpo_jax.config import load_config_file
    path = Path(__file__).resolve().parents[2] / "configs" / "synthetic_repro.py"
    c = load_config_file(path, "mode=single,noise=0.05,seed=2,recap=false,summary=false")
    assert (c.rollout.mode, c.data.noise, c.train.seed, c.data.shuffle_seed) == (
        "single", 0.05, 2, 2)
    assert (c.rollout.user_query_recap, c.rollout.final_summary) == (False, False)
    assert c.eval.split == "test" and c.sft.modes == "single"  # SFT on its own way of working
    default = load_config_file(path, "seed=1")
    assert default.sft.modes == default.rollout.mode == "matpo"
    # the single agent does every hop itself: a worker's turns per hop (5 are needed for 2 hops)
    assert c.rollout.max_turns_planner == c.data.max_hops * c.rollout.max_turns_worker >= 5
    for field in ("train.steps", "sft.steps", "sft.num_demos", "data.batch_size", "rl.lr",
                  "rollout.group_size", "rollout.max_context", "tools.max_response_chars",
                  "model.hf_checkpoint"):  # the same budgets, context and start for every method
        section, name = field.split(".")
        assert default[section][name] == c[section][name], field


def _run_arg(job):
    return next(a for a in job.command if a.startswith("--config=")).split(":", 1)[1]


def test_each_method_starts_rl_from_sft_on_its_own_prompt_format(tmp_path):
    jobs = reproduce.plan(str(tmp_path), ["0.05", "0.6"], ["0", "1"], list(reproduce.VARIANTS),
                          ["0.6"], None, ["data.data_dir=/d"])
    by_name = {j.name: j for j in jobs}
    names = [j.name for j in jobs]
    # The compared methods first, everywhere; the ablations (only at 0.6) after them.
    assert names.index("matpo_noise0.6_seed1") < names.index("sft_matpo_no_recap_noise0.6")
    assert "sft_matpo_no_recap_noise0.05" not in by_name
    own_sft = [v for v, spec in reproduce.VARIANTS.items() if spec.sft_of is None]
    assert {"single", "matpo", "matpo_no_recap", "matpo_no_summary"} <= set(own_sft)
    for variant in own_sft:
        sft = by_name[f"sft_{variant}_noise0.6"]
        assert _run_arg(sft) == f"{reproduce.VARIANTS[variant].arg},noise=0.6,seed=0"
        assert "--config.train.steps=0" in sft.command
        for seed in ("0", "1"):
            rl = by_name[f"{variant}_noise0.6_seed{seed}"]
            assert _run_arg(rl) == f"{reproduce.VARIANTS[variant].arg},noise=0.6,seed={seed}"
            start = [a for a in rl.command if a.startswith("--config.sft.init_checkpoint=")]
            assert start == [f"--config.sft.init_checkpoint="
                             f"{tmp_path}/runs/sft_{variant}_noise0.6/checkpoints/sft"]
            assert sft.name in rl.after and "--config.data.data_dir=/d" in rl.command
    # One run per noise level builds the world; the others at that level wait for it.
    assert by_name["sft_single_noise0.6"].after == ()
    assert by_name["sft_matpo_noise0.6"].after == ("sft_single_noise0.6",)
    # Once an SFT at a level has finished, its world exists: the next grid's SFTs start together.
    finished = tmp_path / "runs" / "sft_single_noise0.6"
    finished.mkdir(parents=True)
    (finished / "summary.json").write_text("{}")
    again = {j.name: j for j in reproduce.plan(
        str(tmp_path), ["0.05", "0.6"], ["0"], ["matpo", "matpo_no_recap", "matpo_no_summary"],
        ["0.6"], None, [])}
    assert again["sft_matpo_noise0.6"].after == ()
    assert again["sft_matpo_no_recap_noise0.6"].after == ()
    assert again["sft_matpo_noise0.05"].after == ()
    assert again["sft_matpo_no_summary_noise0.6"].after == ()


def test_successors_start_from_matpos_sft_with_only_their_credit_rule_changed(tmp_path):
    jobs = reproduce.plan(str(tmp_path), ["0.05", "0.6"], ["0", "1"],
                          ["single", "matpo", "agent_norm", "setwise"], ["0.6"], None, [])
    by_name = {j.name: j for j in jobs}
    assert reproduce.SUCCESSORS == ("agent_norm", "setwise")
    assert not any(n.startswith(("sft_agent_norm", "sft_setwise")) for n in by_name)
    assert "agent_norm_noise0.05_seed0" not in by_name  # only at the ablations' noise levels
    for variant, option in (("agent_norm", "rl.group_by=agent"), ("setwise", "rl.ratio=setwise")):
        for seed in ("0", "1"):
            job = by_name[f"{variant}_noise0.6_seed{seed}"]
            # MATPO's command (arguments, seed, SFT start) in its own workdir, one RL option more
            matpo = by_name[f"matpo_noise0.6_seed{seed}"].command
            assert job.command == [a.replace(f"/matpo_noise0.6_seed{seed}",
                                             f"/{variant}_noise0.6_seed{seed}") for a in matpo
                                   ] + [f"--config.{option}"]
            # every seed takes the SFT evaluation of MATPO's first seed (the same parameters)
            assert job.after == ("sft_matpo_noise0.6", "matpo_noise0.6_seed0")
            assert job.before_start is not None
    with pytest.raises(ValueError, match="setwise starts from matpo's SFT"):
        reproduce.plan(str(tmp_path), ["0.6"], ["0"], ["single", "setwise"], ["0.6"], None, [])


def test_stability_table_reads_each_runs_training_steps(tmp_path):
    import json
    runs = []
    for seed, (spikes, norms) in enumerate([(1, [1.0, 4.0]), (3, [2.0, 2.0])]):
        workdir = tmp_path / f"s{seed}"
        workdir.mkdir()
        rows = [{"step": 0, "eval/accuracy": 0.1}]  # an evaluation row: not a training step
        rows += [{"step": i + 1, "loss": 0.1, "reward/mean": 0.2 * (i + seed), "grad_norm": n,
                  "grad_norm_spikes": spikes, "planner/clip_frac": 0.1 * seed,
                  "worker/clip_frac": 0.0, "planner/grad_norm": n / 2, "worker/grad_norm": n,
                  "time_rollout_s": 10.0 + i + seed, "time_update_s": 4.0}
                 for i, n in enumerate(norms)]
        (workdir / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
        runs.append({"workdir": str(workdir), "final_eval": {"eval/accuracy": 0.3 + 0.1 * seed}})
    stats = reproduce.training_stats(runs[1]["workdir"])
    assert stats == {"reward_last5": pytest.approx(0.3), "grad_norm_spikes": 3.0,
                     "grad_norm_max": 2.0, "clip_frac/planner": pytest.approx(0.1),
                     "clip_frac/worker": 0.0, "grad_norm/planner": 1.0, "grad_norm/worker": 2.0,
                     "step_s/rollout": 11.5, "step_s/update": 4.0}
    row = reproduce.stability_table({"0.6": {"setwise": runs}}, "0.6").splitlines()[2]
    # seed 0: planner norms 0.5, 2.0 (mean 1.25), rollouts 10, 11 s (median 10.5)
    assert row == ("| setwise (2 seeds) | 35.0 ± 5.0 | 0.20 ± 0.10 | 2.0 ± 1.0 | 3.00 ± 1.00 | "
                   "5.0 ± 5.0% / 0.0 ± 0.0% | 1.125 ± 0.125 / 2.250 ± 0.250 | "
                   "11.0 ± 0.5 / 4.0 ± 0.0 |")


def test_per_seed_table_matches_each_seed_with_matpos_run_of_that_seed():
    def run(variant, seed, accuracy):
        return {"workdir": f"/out/runs/{reproduce.rl_name(variant, '0.6', seed)}",
                "final_eval": {"eval/accuracy": accuracy}}
    results = {"0.6": {"matpo": [run("matpo", "0", 0.30), run("matpo", "1", 0.20)],
                       "setwise": [run("setwise", "1", 0.25)]}}  # seed 0 not run
    lines = reproduce.per_seed_table(results, "0.6", ["0", "1"]).splitlines()
    assert lines[0] == "| method | seed 0 | seed 1 | mean ± sd | matched seeds: minus MATPO |"
    assert lines[2] == "| matpo | 30.0 | 20.0 | 25.0 ± 5.0 | - |"
    assert lines[3] == "| setwise | not run | 25.0 | 25.0 ± 0.0 | +5.0 |"  # vs seed 1 only


def test_ablation_table_gives_each_methods_own_sft_start_and_gain():
    def run(variant, seed, start, accuracy):
        return {"workdir": f"/out/runs/{reproduce.rl_name(variant, '0.6', seed)}",
                "sft_eval": {"eval/accuracy": start}, "final_eval": {"eval/accuracy": accuracy}}
    results = {"0.6": {"matpo": [run("matpo", "0", 0.25, 0.30), run("matpo", "1", 0.25, 0.20)],
                       "matpo_no_recap": [run("matpo_no_recap", "0", 0.10, 0.32),
                                          run("matpo_no_recap", "1", 0.10, 0.28)]}}
    lines = reproduce.per_seed_table(results, "0.6", ["0", "1"], start=True).splitlines()
    assert lines[0] == ("| method | SFT start | seed 0 | seed 1 | mean ± sd | gain | "
                        "matched seeds: minus MATPO |")
    assert lines[2] == "| matpo | 25.0 | 30.0 | 20.0 | 25.0 ± 5.0 | +0.0 | - |"
    assert lines[3] == "| matpo_no_recap | 10.0 | 32.0 | 28.0 | 30.0 ± 2.0 | +20.0 | +2.0, +8.0 |"
    assert reproduce.ABLATIONS == ("matpo_no_recap", "matpo_no_summary")


def test_later_seeds_take_the_shared_starts_evaluation(tmp_path):
    jobs = {j.name: j for j in reproduce.plan(str(tmp_path), ["0.6"], ["0", "1"], ["matpo"],
                                              [], None, [])}
    first, second = jobs["matpo_noise0.6_seed0"], jobs["matpo_noise0.6_seed1"]
    assert first.before_start is None and "matpo_noise0.6_seed0" in second.after
    evaluated = tmp_path / "runs" / "matpo_noise0.6_seed0" / "eval"
    evaluated.mkdir(parents=True)
    (evaluated / "sft.json").write_text('{"eval/accuracy": 0.25}')
    (evaluated / "sft_questions.jsonl").write_text('{"id": "q0"}\n')  # for run.eval.paired
    second.before_start()
    copied = tmp_path / "runs" / "matpo_noise0.6_seed1" / "eval" / "sft.json"
    assert copied.read_text() == '{"eval/accuracy": 0.25}'
    assert (copied.parent / "sft_questions.jsonl").read_text() == '{"id": "q0"}\n'
    assert not second.done()
    (copied.parent.parent / "summary.json").write_text("{}")
    assert second.done()


def test_bars_state_what_was_met():
    def runs(*accs):
        return [{"final_eval": {"eval/accuracy": a}, "sft_eval": {"eval/accuracy": 0.0}}
                for a in accs]
    results = {"0.05": {"single": runs(0.40, 0.42), "matpo": runs(0.41, 0.43)},
               "0.6": {"single": runs(0.20, 0.22), "matpo": runs(0.30, 0.32)}}
    gap = reproduce.gaps(results, ["0.05", "0.6"])
    assert gap["0.6"]["gap"] == pytest.approx(10.0) and gap["0.6"]["pooled_sd"] == pytest.approx(1.0)
    lines = reproduce.bars(gap, ["0.05", "0.6"])
    assert all(line.endswith("**met**") for line in lines) and len(lines) == 3
    results["0.6"]["matpo"] = runs(0.21, 0.25)  # +2 points: neither bar, but still above 0.05's
    lines = reproduce.bars(reproduce.gaps(results, ["0.05", "0.6"]), ["0.05", "0.6"])
    assert [line.endswith("**met**") for line in lines] == [False, False, True]
    tie = reproduce.bars({"0.6": {"gap": 0.0, "pooled_sd": 0.0}}, ["0.6"])
    assert [line.endswith("**met**") for line in tie] == [False, False]  # 0 >= 2 x 0 is no win
    assert reproduce.bars({}, ["0.6"]) == ["- no noise level has both compared methods yet"]


def test_the_grid_runs_seed_by_seed_so_an_early_stop_leaves_whole_comparisons(tmp_path):
    jobs = reproduce.plan(str(tmp_path), ["0.05", "0.6"], ["0", "1", "2"], ["single", "matpo"],
                          [], None, [])
    rl = [j.name for j in jobs if not j.name.startswith("sft_")]
    assert rl[:4] == ["single_noise0.05_seed0", "matpo_noise0.05_seed0",
                      "single_noise0.6_seed0", "matpo_noise0.6_seed0"]
    assert [name.rsplit("seed", 1)[1] for name in rl] == ["0"] * 4 + ["1"] * 4 + ["2"] * 4
    assert [j.name for j in jobs[:4]] == [f"sft_{v}_noise{n}" for n in ("0.05", "0.6")
                                          for v in ("single", "matpo")]


def test_collect_reads_each_run_where_it_is_now(tmp_path):
    # A grid folder moved after its runs finished (copied to another machine, renamed): the
    # summaries still name the old workdir; the table must read the metrics beside them.
    import json
    run = tmp_path / "moved" / "runs" / reproduce.rl_name("matpo", "0.6", "0")
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"workdir": "/gone/runs/matpo_noise0.6_seed0",
                                                  "final_eval": {"eval/accuracy": 0.5}}))
    results = reproduce.collect(str(tmp_path / "moved"), ["0.6"], ["0"], ["matpo"], ["0.6"], None)
    assert [s["workdir"] for s in results["0.6"]["matpo"]] == [str(run)]


def test_the_tables_command_names_every_flag_that_shaped_the_runs():
    """A grid run with --overrides (another warm start) must print a command that reruns it,
    not the default grid's."""
    plain = reproduce.grid_command("docs/repro", ["0.6"], ["0"], ["single", "matpo"], ["0.6"])
    assert plain == ("python -m matpo_jax.reproduce --out=docs/repro --noise=0.6 --seeds=0 "
                     "--variants=single,matpo --ablations_at=0.6")
    shaped = reproduce.grid_command("out", ["0.6"], ["0"], ["matpo"], ["0.6"], ["1", "2"],
                                    "model.hf_checkpoint=/w,pretrain.listing_fraction=0.3")
    assert shaped.endswith(" --ablation_seeds=1,2 --overrides="
                           "'model.hf_checkpoint=/w,pretrain.listing_fraction=0.3'")


def test_lora_variants_train_adapters_over_matpos_exported_sft_result(tmp_path):
    jobs = {j.name: j for j in reproduce.plan(
        str(tmp_path), ["0.6"], ["0", "1"], ["matpo", "matpo_lora", "matpo_lora_per_role"],
        ["0.6"], None, [])}
    assert set(reproduce.LORA_VARIANTS) == {"matpo_lora", "matpo_lora_per_role"}
    assert not set(reproduce.LORA_VARIANTS) & set(reproduce.ABLATIONS + reproduce.SUCCESSORS)
    # No SFT of their own: MATPO's SFT result, exported once, is their frozen base.
    assert not any(n.startswith("sft_matpo_lora") for n in jobs)
    export = jobs["sft_matpo_noise0.6_hf"]
    sft = f"{tmp_path}/runs/sft_matpo_noise0.6"
    assert export.command[1:] == ["-m", "matpo_jax.export", f"--checkpoint={sft}/checkpoints/sft",
                                  f"--out={sft}_hf"]
    assert export.after == ("sft_matpo_noise0.6",)
    for variant in reproduce.LORA_VARIANTS:
        for seed in ("0", "1"):
            job = jobs[f"{variant}_noise0.6_seed{seed}"]
            assert "--config.model.lora.rank=16" in job.command
            per_role = "--config.model.lora.roles=per_role" in job.command
            assert per_role == (variant == "matpo_lora_per_role")
            assert {f"--config.model.hf_checkpoint={sft}_hf", "--config.sft.steps=0",
                    "--config.sft.copy_steps=0"} <= set(job.command)
            assert not any(a.startswith("--config.sft.init_checkpoint") for a in job.command)
            # the SFT start's evaluation is MATPO's seed 0's (zero adapters: the same function)
            assert job.after == ("sft_matpo_noise0.6_hf", "matpo_noise0.6_seed0")
            assert job.before_start is not None
    # the export runs before the first LoRA run that needs it, and full fine-tuning is as it was
    names = [j.name for j in reproduce.plan(
        str(tmp_path), ["0.6"], ["0"], ["matpo", "matpo_lora"], ["0.6"], None, [])]
    assert names.index("sft_matpo_noise0.6_hf") < names.index("matpo_lora_noise0.6_seed0")
    assert not any("model.lora" in a or "hf_checkpoint" in a
                   for a in jobs["matpo_noise0.6_seed0"].command)
