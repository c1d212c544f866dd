"""What `pip install sinebert` ships: serving without the train extra, one sentence where training needs it, and no
module of the package that reaches outside it."""

import ast
import re
import subprocess
import sys

from tests.conftest import ROOT

SERVE_WITHOUT_TRAIN_EXTRA = """
import sys
for name in ("accelerate", "datasets", "evaluate", "matplotlib", "seqeval", "sklearn", "scipy"):
    sys.modules[name] = None  # as if the train extra were not installed
import torch
import sinebert
from transformers import AutoModelForSequenceClassification
config = sinebert.SineBertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=37, max_position_embeddings=64)
sinebert.SineBertForSequenceClassification(config).save_pretrained(sys.argv[1])
model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1])
print(tuple(model(input_ids=torch.tensor([[5, 6, 7]])).logits.shape))
try:
    import sinebert.training
except ImportError as error:
    print(error)
"""


def test_a_model_serves_without_the_train_extra_and_training_names_the_extra(tmp_path):
    result = subprocess.run([sys.executable, "-c", SERVE_WITHOUT_TRAIN_EXTRA, str(tmp_path / "model")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    shape, error = result.stdout.strip().splitlines()[-2:]
    assert shape == "(1, 2)"
    assert error.startswith("sinebert.training needs accelerate, datasets") and 'pip install "sinebert[train]"' in error


def _code_strings(path) -> list[tuple[int, str]]:
    """The string constants of a module's code (docstrings and comments, which cite commands, left out)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_module_of_the_package_names_a_path_outside_it():
    outside = re.compile(r"^(shared|scripts|configs|benchmarks|recipes)$|\.\./|shared[/]data")
    hits = [f"{path.relative_to(ROOT)}:{line} {text!r}" for path in (ROOT / "sinebert").rglob("*.py")
            for line, text in _code_strings(path) if outside.search(text)]
    assert hits == []
    parents = [str(path) for path in (ROOT / "sinebert").rglob("*.py")
               if re.search(r"parents\[[1-9]\]", path.read_text())]
    assert parents == []
