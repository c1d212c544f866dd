"""What a run leaves behind besides weights: a JSONL metrics log, loss curves, results JSON and a model card."""

import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on training machines
import matplotlib.pyplot as plt  # noqa: E402


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB. On Linux from /proc/self/status's VmHWM, not ru_maxrss: Linux
    carries ru_maxrss over from the parent through fork and exec, so a fresh measuring process would report its
    launcher's peak whenever that was larger."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # KiB
    import resource  # Unix only: imported here so that the rest of this module works everywhere

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB elsewhere


class MetricsLog:
    """Appends one JSON row per logging or evaluation step to `path` (main process only)."""

    def __init__(self, path: Path, enabled: bool, resume_step: int = 0):
        self.path = Path(path)
        self.enabled = enabled
        if enabled and self.path.exists():
            # On resume, drop rows logged after the checkpoint: they will be logged again, identically.
            rows = [r for r in read_jsonl(self.path) if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def write(self, **row):
        if self.enabled:
            row = {"time": round(time.time(), 3), **row}
            with self.path.open("a") as file:
                file.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_curves(log_path: Path, output: Path, title: str, eval_keys: tuple[str, ...] = ()) -> Path | None:
    """Training loss (and evaluation loss) against steps, plus any `eval_keys` metrics on a second axis."""
    rows = read_jsonl(log_path) if Path(log_path).exists() else []
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    evals = [r for r in rows if any(k.startswith("eval_") for k in r)]
    if not train and not evals:
        return None
    figure, axis = plt.subplots(figsize=(7, 4))
    if train:
        axis.plot(*zip(*train), label="train loss", linewidth=1)
    eval_loss = [(r["step"], r["eval_loss"]) for r in evals if "eval_loss" in r]
    if eval_loss:
        axis.plot(*zip(*eval_loss), "o-", label="validation loss")
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("loss")
    axis.grid(alpha=0.3)
    handles, labels = axis.get_legend_handles_labels()
    points = {key: [(r["step"], r[key]) for r in evals if key in r] for key in eval_keys}
    if any(points.values()):
        second = axis.twinx()
        for key, values in points.items():
            if values:
                second.plot(*zip(*values), "s--", label=key)
        second.set_ylabel("metric")
        more_handles, more_labels = second.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    axis.legend(handles, labels, loc="best")
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(output, dpi=110)
    plt.close(figure)
    return output


def write_json(path: Path, values: dict):
    Path(path).write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")


def write_model_card(path: Path, *, title: str, summary: str, usage: str, results: dict, details: dict):
    """A README.md for the saved model: what it is, how to load it, how it was trained and what it scored."""
    lines = [f"# {title}", "", summary, "", "## Usage", "", "```python", usage.strip(), "```", "", "## Training", ""]
    lines += [f"- {key}: {value}" for key, value in details.items()]
    lines += ["", "## Results", "", "| metric | value |", "|---|---|"]
    lines += [f"| {key} | {_fmt(value)} |" for key, value in sorted(results.items()) if not isinstance(value, (dict, list))]
    Path(path).write_text("\n".join(lines) + "\n")


def _fmt(value):
    return f"{value:.4f}" if isinstance(value, float) else str(value)
