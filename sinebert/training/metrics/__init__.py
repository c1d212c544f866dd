"""Offline metrics, each an `evaluate`-compatible module: `evaluate.load(metric_path("squad"))` works without a
network, and the scripts call the same module's `compute_*` function directly.

Each module stands alone (evaluate copies the file into its own cache before importing it), so the modules import
only evaluate, datasets, numpy, scipy, scikit-learn and seqeval, never each other or sinebert.
"""

from pathlib import Path

METRICS = ("classification", "regression", "seqeval_strict", "squad")


def metric_path(name: str) -> str:
    """The file to pass to `evaluate.load` for metric `name` (one of METRICS)."""
    if name not in METRICS:
        raise ValueError(f"Unknown metric {name!r}; sinebert ships {list(METRICS)}.")
    return str(Path(__file__).with_name(f"{name}.py"))
