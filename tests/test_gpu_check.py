"""benchmarks/gpu_check.py: its CPU quick mode runs every part end to end, and its correctness check fails where a
kernel is wrong."""

import json

import pytest
import torch

from tests.conftest import ROOT


@pytest.mark.slow
def test_the_quick_check_on_a_cpu_runs_every_part_and_every_fast_path_passes(tmp_path):
    from benchmarks import gpu_check

    gpu_check.main(["--device", "cpu", "--quick", "--output_dir", str(tmp_path)])  # here: a process only adds imports
    report = json.loads((tmp_path / "check.json").read_text())
    assert {(row["case"], row["precision"]) for row in report["correctness"]} == {
        (case, precision) for case in ("masked_lm", "classifier", "sliding_window", "sliding_window_band",
                                       "token_dropping")
        for precision in ("fp32", "bf16")}
    assert all(row["passed"] for row in report["correctness"])
    (training,) = report["training"]
    assert set(training["models"]) >= {"sinebert", "bert_sdpa", "modernbert_sdpa"}
    assert all(cell["tokens_per_second"] > 0 for cell in training["models"].values())
    assert [row["precision"] for row in report["inference"]] == ["bf16", "fp32"]
    assert report["long_forward"]["finite"] and report["long_forward"]["tokens"] == 2048
    host = {(row["part"], row["model"], row["precision"]): row for row in report["host"]}
    assert len(host) == 13 and all(row["wall_ms"] > 0 and row["device_ms"] is None for row in host.values())
    # On the CPU's fp32 path (length buckets, the head's rows): the ids, the lengths and the rows read, no more.
    assert host["training step", "sinebert", "fp32"]["reads"] <= 2
    one_bucket, buckets = (host["inference, 4 batches", name, "fp32"] for name in ("sinebert, one bucket", "sinebert"))
    assert one_bucket["reads"] == buckets["reads"]
    assert 0 < one_bucket["operations"] < buckets["operations"]  # a kernel call and its gathers fewer per layer
    assert "| sinebert / fastest peer |" in (tmp_path / "check.md").read_text()


def test_a_wrong_kernel_fails_the_check(monkeypatch):
    from benchmarks import gpu_check
    from sinebert.attention_sinebert import SINEBERT_ATTENTION_FUNCTIONS, matmul_attention_forward

    def off_by_a_fifth(*args, **kwargs):
        output, weights = matmul_attention_forward(*args, **kwargs)
        return output * 1.2, weights

    row = gpu_check.check_case("masked_lm", "bf16", torch.device("cpu"))
    assert row["passed"] and row["kernels"] == ["full_attention via matmul"]
    monkeypatch.setitem(SINEBERT_ATTENTION_FUNCTIONS._local_mapping, "matmul", off_by_a_fifth)
    assert not gpu_check.check_case("masked_lm", "bf16", torch.device("cpu"))["passed"]


def test_the_check_trains_sinebert_as_the_cram_recipe_does():
    import yaml

    from benchmarks import gpu_check

    recipe = yaml.safe_load((ROOT / "configs" / "cram" / "pretrain.yaml").read_text())
    settings = {key: value for key, value in gpu_check.RECIPE.items() if key != "sparse_prediction"}  # (a flag)
    assert settings == {key: recipe[key] for key in settings}


@pytest.mark.slow
def test_the_host_part_alone_prints_its_table_and_writes_nothing(tmp_path, capsys):
    from benchmarks import gpu_check

    gpu_check.main(["--device", "cpu", "--quick", "--host_only", "--output_dir", str(tmp_path / "check")])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| training step")]
    assert [row.split(" | ")[1:3] for row in rows] == [[model, precision] for precision in ("fp32", "bf16")
                                                        for model in ("sinebert", "bert_sdpa", "modernbert_sdpa")]
    assert all(int(row.split(" | ")[5]) > 0 for row in rows)  # the operations counted
    assert not (tmp_path / "check").exists()
