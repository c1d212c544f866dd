"""What a run leaves behind besides weights: a JSONL metrics log, loss curves, results JSON and a model card."""

import json
import sys
import time
from pathlib import Path

import yaml


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
            try:
                with self.path.open("a") as file:
                    file.write(json.dumps(row) + "\n")
            except OSError as error:
                from .errors import UserError, write_failure

                raise UserError(
                    f"Could not append to {self.path} because {write_failure(error)}; the checkpoints written so far "
                    "are intact. Free space, then rerun the same command with --resume_from_checkpoint latest."
                ) from None


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def pyplot():
    """matplotlib's pyplot without a display (training machines have none), imported when a figure is drawn: only
    the main process draws, and the import takes most of a second."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def plot_curves(log_path: Path, output: Path, title: str, eval_keys: tuple[str, ...] = ()) -> Path | None:
    """Training loss (and evaluation loss) against steps, plus any `eval_keys` metrics on a second axis."""
    rows = read_jsonl(log_path) if Path(log_path).exists() else []
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    evals = [r for r in rows if any(k.startswith("eval_") for k in r)]
    if not train and not evals:
        return None
    plt = pyplot()
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


# The hub's task names for each pipeline tag, as model-index entries spell them.
TASK_NAMES = {"fill-mask": "Masked Language Modeling", "feature-extraction": "Feature Extraction",
              "text-classification": "Text Classification",
              "token-classification": "Token Classification", "question-answering": "Question Answering"}


def write_model_card(folder: Path, args, *, title: str, summary: str, pipeline_tag: str, call: str, results: dict,
                     details: dict, pipeline_kwargs: str = ""):
    """README.md for the saved model, with the YAML metadata the hub reads (library, task, base model, datasets, the
    validation scores in model-index form), and args.json, every argument of the run.

    `call` is the example call of the pipeline object `pipe`; the usage shows it with sinebert installed and, for
    machines without it, with `trust_remote_code=True`. Paths in the card are the folder's name and file names, so
    that it reads the same wherever the folder goes (the hub id once --hub_model_id is given).
    """
    folder = Path(folder)
    name = getattr(args, "hub_model_id", None) or folder.name
    metadata = card_metadata(args, name, pipeline_tag, results)
    load = f'pipe = pipeline("{pipeline_tag}", model="{name}"{pipeline_kwargs}'
    lines = ["---", yaml.safe_dump(metadata, sort_keys=False).strip(), "---", "", f"# {title}", "", summary, "",
             "## Usage", "", "```python", "import sinebert  # registers the model with the Auto classes",
             "from transformers import pipeline", "", f"{load})", call, "```", "",
             "Without the sinebert package, the folder's own model code loads it:", "", "```python",
             "from transformers import pipeline", "", f"{load}, trust_remote_code=True)", call, "```", "",
             "## Training", ""]
    lines += [f"- {key}: {value}" for key, value in details.items()]
    lines += ["- arguments: `args.json`", "", "## Results", "", "| metric | value |", "|---|---|"]
    lines += [f"| {key} | {_fmt(value)} |" for key, value in sorted(results.items()) if _scalar_number(value)]
    (folder / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_json(folder / "args.json", {key: _plain(value) for key, value in vars(args).items()})


def card_metadata(args, name: str, pipeline_tag: str, results: dict) -> dict:
    """The model card's YAML header (huggingface_hub.ModelCard reads it): scores under model-index."""
    dataset = getattr(args, "dataset_name", None)
    files = [Path(f).name for f in getattr(args, "train_file", None) or []]
    metadata = {"library_name": "transformers", "pipeline_tag": pipeline_tag, "tags": ["sinebert", pipeline_tag]}
    start = getattr(args, "model_name_or_path", None)
    if start and not Path(start).exists():  # a hub id; a local folder means nothing to the hub
        metadata["base_model"] = start
    if dataset:
        metadata["datasets"] = [dataset]
    metrics = [{"type": key.removeprefix("eval_"), "value": float(f"{value:.6g}"), "name": key}
               for key, value in sorted(results.items())
               if (key.startswith("eval_") or key == "perplexity") and _scalar_number(value)
               and key != "eval_masked_tokens"]
    if metrics:
        metadata["model-index"] = [{"name": name, "results": [{
            "task": {"type": pipeline_tag, "name": TASK_NAMES[pipeline_tag]},
            "dataset": {"name": dataset or ", ".join(files) or "local files", "type": dataset or "local",
                        **({"config": args.dataset_config_name} if getattr(args, "dataset_config_name", None) else {}),
                        "split": "validation"},
            "metrics": metrics,
        }]}]
    return metadata


def _scalar_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain(value):
    """A JSON value for an argument (paths and other objects as strings)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _fmt(value):
    return f"{value:.4f}" if isinstance(value, float) else str(value)
