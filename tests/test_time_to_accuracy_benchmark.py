"""benchmarks/time_to_accuracy.py: each model trains on its own clock to its own budget, and the verdict reads the
curves as the table says."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark():
    path = ROOT / "benchmarks" / "time_to_accuracy.py"
    spec = importlib.util.spec_from_file_location("benchmark_time_to_accuracy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_schedule_warms_up_then_decays_to_zero_at_the_end_of_the_budget():
    tta = load_benchmark()
    assert tta.learning_rate(0.0) == 0.0
    assert tta.learning_rate(tta.WARMUP) == pytest.approx(tta.PEAK_LR)
    assert tta.learning_rate(tta.WARMUP / 2) == pytest.approx(tta.PEAK_LR / 2)
    assert tta.learning_rate((1 + tta.WARMUP) / 2) == pytest.approx(tta.PEAK_LR / 2)
    assert tta.learning_rate(1.0) == 0.0 and tta.learning_rate(1.2) == 0.0


def test_the_contender_furthest_behind_its_budget_steps_next():
    tta = load_benchmark()
    import torch

    model = torch.nn.Linear(2, 2)
    ahead, behind = tta.Contender("a", model, budget=100.0), tta.Contender("b", model, budget=50.0)
    ahead.seconds, behind.seconds = 40.0, 10.0  # shares 0.4 and 0.2
    assert tta.next_contender([ahead, behind]) is behind
    behind.seconds = 50.0  # spent
    assert tta.next_contender([ahead, behind]) is ahead
    ahead.seconds = 100.0
    assert tta.next_contender([ahead, behind]) is None


def test_seconds_to_reach_interpolates_and_says_when_never():
    tta = load_benchmark()
    curve = [(0.0, 0, 0.0), (10.0, 5, 0.1), (20.0, 10, 0.3)]
    assert tta.seconds_to_reach(curve, 0.2) == pytest.approx(15.0)
    assert tta.seconds_to_reach(curve, 0.1) == pytest.approx(10.0)
    assert tta.seconds_to_reach(curve, 0.31) is None


def test_a_tiny_run_spends_each_budget_and_reports_it(tmp_path):
    tta = load_benchmark()
    text = ROOT / "tests" / "fixtures" / "sotu.txt"
    tta.main(["--tiny", "--minutes", "0.02", "--train_file", str(text), "--output_dir", str(tmp_path)])
    report = json.loads((tmp_path / "time_to_accuracy.json").read_text())
    budgets = {name: 1.2 * share for name, _, share in tta.CONTENDERS}
    for name, curve in report["curves"].items():
        points = curve["points"]
        assert curve["budget_seconds"] == pytest.approx(budgets[name])
        assert len(points) == tta.EVALUATIONS + 1 and points[0][:2] == [0.0, 0]
        assert [p[0] for p in points] == sorted(p[0] for p in points)
        assert points[-1][0] >= curve["budget_seconds"] and points[-1][1] == curve["steps"] > 0
    verdict = report["verdict"]
    assert verdict["modernbert_accuracy"] == report["curves"]["modernbert"]["points"][-1][2]
    assert verdict["sinebert_meets_target"] == (verdict["sinebert_accuracy"] >= verdict["modernbert_accuracy"])
    table = (tmp_path / "time_to_accuracy.md").read_text()
    assert "| sinebert, token dropping | 0.01 |" in table and "| 100% |" in table
    assert (tmp_path / "time_to_accuracy.png").stat().st_size > 0
