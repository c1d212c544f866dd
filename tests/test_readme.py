"""The README's usage section runs as written."""

import re

from tests.conftest import ROOT


def test_readme_usage_runs(tmp_path, monkeypatch, capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    usage = readme.split("## Usage", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", usage, flags=re.S)
    assert blocks, "the README's usage section has no python example"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("{") and "'answer'" in printed[-1]
    assert (tmp_path / "runs" / "usage" / "qa" / "pipeline_sinebert.py").is_file()
