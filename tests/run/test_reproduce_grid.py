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
    def run(acc, hop1, sft):
        return {"final_eval": {"eval/accuracy": acc, "eval/accuracy_hop1": hop1},
                "sft_eval": {"eval/accuracy": sft}}
    results = {"0.3": {"single": [run(0.1, 0.2, 0.05), run(0.3, 0.4, 0.05)],
                       "matpo": [run(0.5, 0.6, 0.1)]}}
    lines = reproduce.table(results, ["0.3"], ["eval/accuracy_hop1"]).splitlines()
    assert lines[0].split("|")[1:-1] == [" noise ", " method ", " accuracy ", " hop1 "]
    assert lines[2] == "| 0.3 | single (SFT start 5.0; 2 seeds) | 20.0 ± 10.0 | 30.0 ± 10.0 |"
    assert lines[3] == "| 0.3 | matpo (SFT start 10.0; 1 seeds) | 50.0 ± 0.0 | 60.0 ± 0.0 |"


def test_repro_config_applies_every_argument():
    from pathlib import Path

    from matpo_jax.config import load_config_file
    path = Path(__file__).resolve().parents[2] / "configs" / "synthetic_repro.py"
    c = load_config_file(path, "mode=single,noise=0.05,seed=2,recap=false,summary=false")
    assert (c.rollout.mode, c.data.noise, c.train.seed, c.data.shuffle_seed) == (
        "single", 0.05, 2, 2)
    assert (c.rollout.user_query_recap, c.rollout.final_summary) == (False, False)
    assert c.eval.split == "test"
    default = load_config_file(path, "seed=1")
    assert default.train.steps == c.train.steps  # the same RL budget for every method
