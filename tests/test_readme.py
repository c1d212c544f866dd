"""The README's usage section runs as written, and every command in the README and in docs/ names a make target, a
script or module that exists, with flags that its parser accepts."""

import ast
import io
import re
import runpy
import shlex
import subprocess
import sys
from contextlib import chdir, redirect_stdout
from functools import cache
from unittest.mock import patch

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))


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
    assert printed[-2].startswith("['full_attention via ")  # attention_kernels()
    assert (tmp_path / "runs" / "usage" / "qa" / "pipeline_sinebert.py").is_file()


def commands() -> list[tuple[str, str]]:
    """(page, command) for every command line of the pages' bash blocks, continuation lines joined, and of the
    example commands that open each script's docstring (its --help)."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if line and not line.startswith("#"):
                    found.append((page.name, line))
    for script in SCRIPTS:
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8")))
        found += [(script.name, line.strip()) for line in doc.replace("\\\n", " ").splitlines()
                  if line.strip().startswith(("python ", "accelerate launch "))]
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_a_script_help_shows_its_docstring_as_written(script):
    """--help prints the docstring: a backslash that continues an example command must stay in it (a raw string)
    for the command to copy as shown, not as one line with a gap."""
    source = script.read_text(encoding="utf-8")
    assert ast.get_docstring(ast.parse(source), clean=False) == source.split('"""', 2)[1]


@cache
def help_text(*program: str) -> str:
    """What `python <program> --help` prints. Run in this process (runpy, as the interpreter runs a script or `-m`):
    a fresh interpreter per program spent ten seconds importing torch and transformers again."""
    target, *rest = program[1:] if program[0] == "-m" else program
    out = io.StringIO()
    with patch.object(sys, "argv", [target, *rest, "--help"]), redirect_stdout(out), chdir(ROOT), \
            pytest.raises(SystemExit) as end:
        if program[0] == "-m":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(str(ROOT / target), run_name="__main__")
    assert end.value.code in (0, None), f"{' '.join(program)} --help ended with {end.value.code}"
    return out.getvalue()


@pytest.mark.parametrize(("page", "command"), commands())
def test_every_documented_command_names_what_exists_with_flags_it_accepts(page, command):
    words = [word for word in shlex.split(command) if "=" not in word or word.startswith("-")]
    if words[0] == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M)
        assert words[1] in targets, command
        return
    if words[0] == "bash":  # a shell script of the repository, which bash can parse
        assert (ROOT / words[1]).is_file(), command
        assert subprocess.run(["bash", "-n", words[1]], cwd=ROOT).returncode == 0, command
        return
    if "-m" in words:
        module = words[words.index("-m") + 1]
        program, rest = ["-m", module], words[words.index("-m") + 2 :]
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), command
    else:
        script = next(word for word in words if word.endswith(".py"))
        program, rest = [script], words[words.index(script) + 1 :]
        assert (ROOT / script).is_file(), command
    if rest and not rest[0].startswith("-") and rest[0] != "...":
        program, rest = [*program, rest[0]], rest[1:]  # a subcommand
    accepted = help_text(*program)
    for flag in (word.split("=")[0] for word in rest if word.startswith("--")):
        assert re.search(rf"{re.escape(flag)}\b", accepted), f"{page}: {flag} is not an option of {' '.join(program)}"
