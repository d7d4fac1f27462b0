"""Several runs compared (report/compare.py, report/seeds.py): the numbers over seeds, the figure,
the command and its one-line errors."""
import numpy as np
import pytest
from matplotlib import image as mpimg

from fixtures.fake_runs import curve_accuracy, write_fake_run
from matpo_jax.report import compare
from matpo_jax.report.metrics import MetricsWriter, load_metrics, series
from matpo_jax.report.seeds import seed_curves
from matpo_jax.report.smoothing import ema

TAB_BLUE, TAB_ORANGE = (31, 119, 180), (255, 127, 14)  # matplotlib's C0 and C1


def colour_fraction(image, rgb, tolerance=40):
    pixels = (image[..., :3] * 255).astype(int)
    return np.mean(np.all(np.abs(pixels - np.array(rgb)) < tolerance, axis=-1))


@pytest.fixture
def runs(tmp_path):
    """Three MATPO seeds and two single-agent seeds, 30 RL steps, the curve every 10."""
    matpo = [str(write_fake_run(tmp_path / f"m{s}", seed=s).parent) for s in range(3)]
    single = [str(write_fake_run(tmp_path / f"s{s}", seed=3 + s, offset=0.05).parent)
              for s in range(2)]
    return matpo, single


def test_seed_curves_mean_spread_on_common_steps(tmp_path, runs):
    matpo, _ = runs
    paths = [f"{run}/metrics.jsonl" for run in matpo]
    curves = seed_curves(paths, "curve/accuracy")
    assert curves.n == 3 and list(curves.steps) == [0, 10, 20, 30]
    expected = np.array([[curve_accuracy(step, s, 0.0) for step in (0, 10, 20, 30)]
                         for s in range(3)])  # seeds 0.01 apart: mean = seed 1, sd = 0.01
    np.testing.assert_allclose(curves.mean, expected[1])
    np.testing.assert_allclose(curves.sd, 0.01)
    np.testing.assert_allclose(curves.low, expected[0])
    np.testing.assert_allclose(curves.high, expected[2])
    np.testing.assert_allclose(curves.spread("sd")[1], expected[1] + 0.01)
    # a seed still running (20 of 30 steps) limits the comparison to the steps all logged
    short = str(write_fake_run(tmp_path / "short", seed=5, steps=20))
    assert list(seed_curves(paths + [short], "curve/accuracy").steps) == [0, 10, 20]
    with pytest.raises(KeyError, match="'nope' is not in"):
        seed_curves(paths, "nope")


def test_compare_runs_draws_the_numbers_it_returns(tmp_path, runs):
    matpo, single = runs
    groups = {"matpo": [f"{r}/metrics.jsonl" for r in matpo],
              "single": [f"{r}/metrics.jsonl" for r in single]}
    out = tmp_path / "fig.png"
    curves = compare.compare_runs(groups, out, band="sd")
    single_val = curves["single"].validation
    assert single_val.key == "curve/accuracy" and single_val.n == 2
    at_zero = [curve_accuracy(0, s, 0.05) for s in (3, 4)]
    assert single_val.mean[0] == pytest.approx(np.mean(at_zero))
    assert single_val.sd[0] == pytest.approx(np.std(at_zero, ddof=1))
    # the reward: each seed smoothed, then the mean over seeds
    reward = curves["matpo"].reward
    raw = np.stack([series(load_metrics(p), "reward/mean")[1] for p in groups["matpo"]])
    np.testing.assert_allclose(reward.mean,
                               np.mean([ema(r, curves["matpo"].weight) for r in raw], axis=0))
    assert list(reward.steps) == list(range(1, 31))
    image = mpimg.imread(out)
    assert image.shape[1] > 1000  # two panels side by side
    assert colour_fraction(image, TAB_BLUE) > 1e-3 and colour_fraction(image, TAB_ORANGE) > 1e-3
    band = (np.array(TAB_ORANGE) * 0.2 + 255 * 0.8).astype(int)  # alpha 0.2 over white
    assert colour_fraction(image, band, tolerance=10) > 1e-3


def test_the_command_prints_each_method_and_names_what_is_missing(tmp_path, runs, capsys):
    matpo, single = runs
    out = tmp_path / "cmp.png"
    spec = f"matpo:{','.join(matpo)};single:{','.join(single)}"
    assert compare.main(["compare", f"--runs={spec}", f"--out={out}"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == ("matpo (n=3) curve/accuracy: step 0: 11.0% ± 1.0% (min 10.0%, "
                          "max 12.0%); step 30: 17.0% ± 1.0% (min 16.0%, max 18.0%)")
    assert printed[1].startswith("single (n=2) curve/accuracy: step 0: 18.5% ± 0.7%")
    assert out.exists()

    missing = str(tmp_path / "absent")
    assert compare.main(["compare", f"--runs={matpo[0]},{missing}", f"--out={out}"]) == 1
    assert capsys.readouterr().err.strip() == f"compare: run directory {missing} does not exist"
    (tmp_path / "empty").mkdir()
    assert compare.main(["compare", f"--runs={tmp_path / 'empty'}", f"--out={out}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"compare: {tmp_path / 'empty' / 'metrics.jsonl'} does not exist")
    assert "\n" not in err
    assert compare.main(["compare", "--runs=a:x;a:y", f"--out={out}"]) == 1
    assert "given twice" in capsys.readouterr().err


def test_runs_without_a_validation_curve_compare_their_full_evaluations(tmp_path, capsys):
    dirs = []
    for seed in range(2):
        with MetricsWriter(tmp_path / f"r{seed}", tensorboard=False) as writer:
            writer.write(0, {"eval/accuracy": 0.1 + 0.02 * seed})
            for step in range(1, 6):
                writer.write(step, {"reward/mean": 0.1 * step})
            writer.write(5, {"eval/accuracy": 0.2 + 0.02 * seed})
        dirs.append(str(tmp_path / f"r{seed}"))
    out = tmp_path / "old.png"
    assert compare.main(["compare", f"--runs={','.join(dirs)}", f"--out={out}"]) == 0
    assert capsys.readouterr().out.startswith("runs (n=2) eval/accuracy: step 0: 11.0%")
    assert compare.main(["compare", f"--runs={','.join(dirs)}", f"--out={out}",
                         "--val_key=curve/accuracy"]) == 1
    assert "--val_key=eval/accuracy" in capsys.readouterr().err


def test_parse_runs():
    assert compare.parse_runs("runs/a,runs/b") == {"runs": ["runs/a", "runs/b"]}
    assert compare.parse_runs("matpo:runs/m0, runs/m1; single:runs/s0") == {
        "matpo": ["runs/m0", "runs/m1"], "single": ["runs/s0"]}
    assert compare.parse_runs("gs://bucket/r0,gs://bucket/r1") == {
        "runs": ["gs://bucket/r0", "gs://bucket/r1"]}
    assert compare.parse_runs("m:gs://bucket/r0") == {"m": ["gs://bucket/r0"]}
    with pytest.raises(compare.CompareError, match="not LABEL:DIR"):
        compare.parse_runs("matpo:")


def test_plot_comparison_mean_and_sd_band(tmp_path, runs):
    matpo, single = runs
    out = compare.plot_comparison({"MATPO": [f"{r}/metrics.jsonl" for r in matpo],
                                   "single": [f"{r}/metrics.jsonl" for r in single]},
                                  tmp_path / "repro.png", keys=("reward/mean", "loss"),
                                  title="reproduction")
    image = mpimg.imread(out)
    assert image.shape[1] > 900
    assert colour_fraction(image, TAB_BLUE) > 1e-3 and colour_fraction(image, TAB_ORANGE) > 1e-3
    with pytest.raises(KeyError, match="missing"):
        compare.plot_comparison({"a": [f"{matpo[0]}/metrics.jsonl"]}, tmp_path / "x.png",
                                keys=("missing",))
