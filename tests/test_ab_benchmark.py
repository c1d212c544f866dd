"""benchmarks/ab.py loads each tree's own sinebert into one process and times the two against a peer."""

import shutil
import subprocess
import sys

from tests.conftest import ROOT


def test_each_version_runs_its_own_code_and_the_ratios_are_printed(tmp_path):
    before = tmp_path / "before"
    shutil.copytree(ROOT / "sinebert", before / "sinebert")
    shutil.copytree(ROOT / "configs", before / "configs")
    (before / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "speed.py", before / "benchmarks")
    with open(before / "sinebert" / "__init__.py", "a") as init:
        init.write("\nprint('loaded the other tree')\n")
    result = subprocess.run(
        [sys.executable, "benchmarks/ab.py", str(before), "--training", "small", "fp32", "--repeats", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("loaded the other tree") == 1  # its sinebert, once; this tree's came from here
    assert "training small fp32, median of 1: before" in result.stdout
    assert "after / before: x" in result.stdout and "against modernbert_eager: before x" in result.stdout


def test_a_folder_that_is_not_a_checkout_is_refused_in_one_sentence(tmp_path):
    result = subprocess.run([sys.executable, "benchmarks/ab.py", str(tmp_path)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert f"{tmp_path}: not a sinebert checkout" in result.stderr and "Traceback" not in result.stderr
