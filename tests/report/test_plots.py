"""The grouped figures of one run (report/plots.py) and the smoothing they draw (smoothing.py)."""
import numpy as np
import pytest
from matplotlib import image as mpimg

from fixtures.fake_runs import write_fake_run
from matpo_jax.report import plots
from matpo_jax.report.metrics import MetricsWriter, load_metrics, series
from matpo_jax.report.smoothing import auto_weight, ema

TAB_BLUE, TAB_ORANGE = (31, 119, 180), (255, 127, 14)  # matplotlib's C0 and C1


def colour_fraction(image, rgb, tolerance=40):
    pixels = (image[..., :3] * 255).astype(int)
    return np.mean(np.all(np.abs(pixels - np.array(rgb)) < tolerance, axis=-1))


def test_ema_on_a_known_series():
    # debiased EMA = sum_j w^(i-j) v[j] / sum_j w^(i-j): at w = 0.5 the weights 1, 0.5, 0.25...
    values = np.array([1.0, 3.0, 3.0, 7.0])
    expected = [1.0, (0.5 * 1 + 1 * 3) / 1.5, (0.25 * 1 + 0.5 * 3 + 3) / 1.75,
                (0.125 * 1 + 0.25 * 3 + 0.5 * 3 + 7) / 1.875]
    np.testing.assert_allclose(ema(values, 0.5), expected)
    np.testing.assert_array_equal(ema(values, 0.0), values)
    np.testing.assert_allclose(ema(np.full(50, 2.5), 0.9), 2.5)  # debiased: no ramp from zero
    # a NaN (not measured that step) keeps the previous average
    np.testing.assert_allclose(ema(np.array([1.0, np.nan, 3.0]), 0.5), [1.0, 1.0, 7 / 3])
    assert auto_weight(30) == pytest.approx(0.5)  # span 3 steps
    assert auto_weight(2000) == pytest.approx(1 - 2 / 51)  # span capped at 50
    assert auto_weight(5) == pytest.approx(1 - 2 / 3)  # span at least 2


def test_grouped_figures_from_a_run_with_a_validation_curve(tmp_path):
    path = write_fake_run(tmp_path / "run", sft_steps=40)
    written = plots.plot_run(path, tmp_path / "plots")
    assert set(written) == {"overview", "rollouts", "optimisation"}
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "optimisation.png", "overview.png", "rollouts.png"]  # no per-metric PNGs
    for name, png in written.items():
        image = mpimg.imread(png)
        assert image.shape[0] > 600 and image.shape[1] > 900, name
        assert np.mean(image[..., :3] < 0.9) > 0.02, f"{name}.png is nearly blank"
    # planner and worker drawn side by side in the rollouts figure
    rollouts = mpimg.imread(written["rollouts"])
    assert colour_fraction(rollouts, TAB_BLUE) > 1e-3 and colour_fraction(rollouts, TAB_ORANGE) > 1e-3
    sft = plots.plot_run(tmp_path / "run" / "sft" / "metrics.jsonl", tmp_path / "plots",
                         figures=plots.SFT_FIGURES)
    assert set(sft) == {"sft"} and mpimg.imread(sft["sft"]).shape[1] > 900


def test_each_line_of_the_overview_reads_its_metric(tmp_path):
    """The lines drawn are the run's values: the validation curve at its evaluated steps (step 0
    and the last from the full evaluations), the full evaluations as markers, per-step metrics
    smoothed over their raw values."""
    path = write_fake_run(tmp_path / "run", steps=30, eval_every=10)
    records = load_metrics(path)
    keys = {k for r in records for k in r}
    overview = plots.RL_FIGURES[0]
    validation = next(p for p in overview.panels if p.title == "Validation accuracy")
    lines = plots._lines(validation, keys, records)
    assert [(key, label) for _, key, label in lines] == [
        ("curve/accuracy", "validation curve (96 questions)"),
        ("eval/accuracy", "full evaluation (360 questions)")]
    steps, _ = series(records, "curve/accuracy")
    assert list(steps) == [0, 10, 20, 30]
    roles = plots._lines(plots.RL_FIGURES[1].panels[0], keys, records)
    assert [label for _, _, label in roles] == ["planner", "worker"]


def test_a_run_logging_few_metrics_gets_only_its_panels(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        for step in range(1, 6):
            writer.write(step, {"loss": 1.0 / step})
    written = plots.plot_run(tmp_path / "metrics.jsonl", tmp_path / "plots")
    assert set(written) == {"overview"}  # the loss panel alone; nothing else to draw
    assert plots.plot_run(tmp_path / "metrics.jsonl", tmp_path / "sft",
                          figures=plots.SFT_FIGURES) == {}
