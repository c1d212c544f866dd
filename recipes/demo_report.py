"""The demo's REPORT.md: a results table (metrics, time and tokens/s of each stage), the comparison with and without
pretraining, pictures (pretraining and fine-tuning curves, confusion matrices, attention heatmaps), the served
models' answers, and where the data came from."""

import json
import math
import os
import platform
import time
from pathlib import Path

from sinebert.training.reporting import plot_curves, pyplot, read_jsonl

from .demo_eval import BAG_OF_WORDS, serve_examples
from .stages import finetune_launch

ATTENTION_TEXT = "The people of the United States expect the Congress to pass the budget this year."
TASKS = {
    "classification": ("Rotten Tomatoes fresh/rotten", "eval_accuracy", "validation accuracy"),
    "ner": ("WNUT-16 Twitter NER", "eval_f1", "validation entity F1"),
}
START_STYLE = {"pretrained": ("from the pretrained checkpoint", "tab:blue"),
               "scratch": ("from random initialisation", "tab:orange")}


def _json(path: Path) -> dict:
    return json.loads(Path(path).read_text()) if Path(path).is_file() else {}


# ----- figures -----


def plot_finetuning(paths, output: Path) -> Path:
    """Training loss and validation metric against steps, pretrained vs scratch, for both tasks (a 2 x 2 grid)."""
    plt = pyplot()
    figure, axes = plt.subplots(2, 2, figsize=(11, 7))
    for row, (task, (title, metric, label)) in enumerate(TASKS.items()):
        for start, (name, colour) in START_STYLE.items():
            log = paths.finetuned(task, start) / "metrics.jsonl"
            rows = read_jsonl(log) if log.is_file() else []
            train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
            scores = [(r["step"], r[metric]) for r in rows if metric in r]
            if train:
                axes[row][0].plot(*zip(*train), color=colour, linewidth=1, label=name)
            if scores:
                axes[row][1].plot(*zip(*scores), "o-", color=colour, label=name)
        axes[row][0].set(title=f"{title}: training loss", xlabel="optimizer step", ylabel="loss")
        axes[row][1].set(title=f"{title}: {label}", xlabel="optimizer step", ylabel=label)
        for axis in axes[row]:
            axis.grid(alpha=0.3)
            axis.legend(loc="best", fontsize=8)
    figure.tight_layout()
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return output


def plot_confusion(evaluation: dict, output: Path) -> Path:
    """Test-set confusion matrices of the two classifiers side by side (rows: gold, columns: predicted)."""
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(9, 4))
    for axis, start in zip(axes, START_STYLE):
        result = evaluation[f"classification-{start}"]
        labels, matrix = result["confusion_matrix"]["labels"], result["confusion_matrix"]["matrix"]
        axis.imshow(matrix, cmap="Blues")
        for i, values in enumerate(matrix):
            for j, count in enumerate(values):
                axis.text(j, i, str(count), ha="center", va="center", fontsize=12,
                          color="white" if count > max(map(max, matrix)) / 2 else "black")
        axis.set_xticks(range(len(labels)), labels)
        axis.set_yticks(range(len(labels)), labels)
        axis.set(xlabel="predicted", ylabel="gold",
                 title=f"{START_STYLE[start][0]}\naccuracy {result['accuracy']:.3f}")
    figure.suptitle("Rotten Tomatoes test split: confusion matrices")
    figure.tight_layout()
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return output


def make_figures(plan, paths, evaluation: dict) -> dict[str, Path]:
    paths.figures.mkdir(parents=True, exist_ok=True)
    figures = {
        "pretraining": plot_curves(paths.pretrain / "metrics.jsonl", paths.figures / "pretraining.png",
                                   f"sinebert MLM pretraining ({plan.mode} demo)", ("eval_accuracy",)),
        "finetuning": plot_finetuning(paths, paths.figures / "finetuning.png"),
        "confusion": plot_confusion(evaluation, paths.figures / "confusion.png"),
        "attention": paths.figures / "attention.png",
    }
    return {name: path for name, path in figures.items() if path is not None and Path(path).is_file()}


# ----- tables -----


def stage_rows(paths, ledger, evaluation: dict) -> list[tuple[str, str, str, str]]:
    """(stage, result, wall time, tokens/s) for each stage of the demo."""
    sources = _json(paths.data / "sources.json")
    tokenizer = _json(paths.tokenizer / "tokenizer_training.json")
    pretrain, nan = _json(paths.pretrain / "all_results.json"), float("nan")
    data = ", ".join(f"{name} {sum(v for k, v in entry['statistics'].items() if k.endswith('_examples')):,} examples"
                     for name, entry in sources.items() if name != "sotu")
    speeches = sources.get("sotu", {}).get("statistics", {})
    rows = [
        ("data", f"sotu {speeches.get('addresses', 0)} addresses ({speeches.get('words', 0):,} words), {data}",
         _time(ledger.seconds("data")), "-"),
        ("tokenizer", f"WordPiece, {tokenizer.get('vocab_size', 0):,} tokens, cased",
         _time(ledger.seconds("tokenizer")), "-"),
        ("pretraining (MLM)",
         f"{pretrain.get('train_steps', 0):,} steps, {pretrain.get('train_tokens', 0):,} tokens; validation loss "
         f"{pretrain.get('eval_loss', nan):.3f}, perplexity {pretrain.get('perplexity', nan):.1f}, "
         f"masked-token accuracy {pretrain.get('eval_accuracy', nan):.3f}",
         _time(ledger.seconds("pretrain")), _rate(pretrain)),
    ]
    for task, (title, _, _) in TASKS.items():
        for start in START_STYLE:
            results = _json(paths.finetuned(task, start) / "all_results.json")
            test = evaluation.get(f"{task}-{start}", {})
            rows.append((f"{title}, {start}", f"{results.get('train_steps', 0):,} steps; {_test_summary(task, test)}",
                         _time(ledger.seconds(f"{task}-{start}")), _rate(results)))
    eval_rate = [evaluation[f"{task}-{start}"]["tokens_per_second"] for task in TASKS for start in START_STYLE
                 if f"{task}-{start}" in evaluation]
    bag = evaluation.get(BAG_OF_WORDS)
    rows.append(("test evaluation", "4 models on the test splits" + (
        f"; TF-IDF + logistic regression trained and scored on Rotten Tomatoes in {bag['seconds']:.0f}s: "
        f"{_test_summary('classification', bag)}" if bag else ""), _time(ledger.seconds("evaluate")),
        f"{sum(eval_rate) / len(eval_rate):,.0f} (inference)" if eval_rate else "-"))
    rows.append(("attention heatmaps", "every layer and head, pretrained model", _time(ledger.seconds("attention")),
                 "-"))
    return rows


def comparison_rows(evaluation: dict, sources: dict) -> list[tuple[str, str, float, float, float]]:
    """(task, metric, pretrained, scratch, TF-IDF + logistic regression) on the test splits (NaN: no baseline)."""
    movies = sources.get("rotten_tomatoes", {}).get("statistics", {})
    tweets = sources.get("wnut16", {}).get("statistics", {})
    cls = (f"Rotten Tomatoes fresh/rotten ({movies.get('test_examples', 0):,} snippets of "
           f"{movies.get('test_movies', 0)} unseen movies)")
    ner = f"WNUT-16 NER ({tweets.get('test_examples', 0)} tweets, {tweets.get('test_entities', 0)} entities)"
    pick = lambda key, metric: evaluation.get(key, {}).get(metric, float("nan"))  # noqa: E731
    rows = [(cls, "accuracy", "classification", "accuracy"), (cls, "macro-F1", "classification", "macro_f1"),
            (ner, "entity F1", "ner", "f1"), (ner, "entity precision", "ner", "precision"),
            (ner, "entity recall", "ner", "recall")]
    return [(name, label, pick(f"{task}-pretrained", metric), pick(f"{task}-scratch", metric),
             pick(BAG_OF_WORDS, metric) if task == "classification" else float("nan"))
            for name, label, task, metric in rows]


def _test_summary(task: str, test: dict) -> str:
    if not test:
        return "not evaluated"
    if task == "classification":
        return f"test accuracy {test['accuracy']:.3f}, macro-F1 {test['macro_f1']:.3f}"
    return f"test entity F1 {test['f1']:.3f} (P {test['precision']:.3f}, R {test['recall']:.3f})"


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m {rest:02d}s" if minutes else f"{rest}s"


def _score(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _rate(results: dict) -> str:
    rate = results.get("train_tokens_per_second")
    return f"{rate:,.0f}" if rate else "-"


def markdown_table(header: tuple, rows: list[tuple]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def machine() -> str:
    """The CPU model, core count and GPUs of this machine, in words."""
    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() \
        else []
    return f"{cpu}, {os.cpu_count()} cores" + (f", GPUs: {', '.join(gpus)}" if gpus else ", no GPU") + \
        f"; torch {torch.__version__}"


# ----- the report -----


def write_report(plan, paths, launch, ledger) -> Path:
    evaluation = _json(paths.evaluation)
    figures = make_figures(plan, paths, evaluation)
    serving = serve_examples(paths)
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(), "processes": launch.describe(),
        "finetuning_processes": finetune_launch(launch).describe(), "mode": plan.mode,
        "total_seconds": ledger.wall_seconds(),
        "stages": stage_rows(paths, ledger, evaluation),
        "comparison": comparison_rows(evaluation, _json(paths.data / "sources.json")), "serving": serving,
    }
    (paths.root / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    paths.report.write_text(report_markdown(plan, paths, summary, figures))
    return paths.report


def _finetuning_sentence(summary: dict) -> str:
    if summary["finetuning_processes"] == summary["processes"]:
        return "and so did each fine-tuning run"
    return (f"and each fine-tuning run as {summary['finetuning_processes']}, the runs from the checkpoint and from "
            "random weights side by side")


def model_description(size: dict) -> str:
    parts = [f"hidden {size['hidden_size']}", f"{size['num_hidden_layers']} layers",
             f"{size['num_attention_heads']} heads", f"FFN {size['intermediate_size']}",
             f"{size.get('norm_placement', 'post')}-LN"]
    if size.get("scale_embeddings"):
        parts.append("word embeddings scaled by sqrt(hidden)")
    rotary = size.get("position_embedding_type") == "rotary"
    return ", ".join(parts + ["rotary sinusoidal positions" if rotary else "fixed sinusoidal positions"])


def report_markdown(plan, paths, summary: dict, figures: dict[str, Path]) -> str:
    lines = [
        f"# sinebert demo report ({plan.mode} mode)", "",
        f"Run on {summary['date']} on {summary['machine']}; pretraining ran as {summary['processes']}, "
        f"{_finetuning_sentence(summary)}. The stages took {_time(summary['total_seconds'])} end to end.", "",
        f"Model: {model_description(plan.model)}; pretraining blocks of {plan.seq_length} tokens.", "",
        "## Results", "",
        *markdown_table(("stage", "result", "wall time", "training tokens/s"), summary["stages"]), "",
        "## With and without pretraining (test splits)", "",
        "Both runs of a task use the same architecture, tokenizer, data, seed and settings; the only difference is "
        "the starting weights. TF-IDF (word 1- and 2-grams) + logistic regression, trained in seconds on the same "
        "training split, is the bar a classifier has to clear.", "",
        *markdown_table(("task", "metric", "pretrained", "from scratch", "difference", "TF-IDF + logistic regression"),
                        [(t, m, f"{p:.3f}", f"{s:.3f}", f"{p - s:+.3f}", _score(b))
                         for t, m, p, s, b in summary["comparison"]]),
        "",
        "## Pictures", "",
    ]
    captions = {
        "pretraining": "Pretraining: training and validation loss, masked-token accuracy",
        "finetuning": "Fine-tuning: training loss and validation score, pretrained vs from scratch",
        "confusion": "Test-set confusion matrices of the two classifiers",
        "attention": f"Attention of the pretrained model for \"{ATTENTION_TEXT}\" (rows attend to columns)",
    }
    for name, path in figures.items():
        lines += [f"### {captions[name]}", "", f"![{name}]({Path(path).relative_to(paths.root)})", ""]
    lines += ["## Served with `pipeline(...)`", "", "```"]
    lines += [f"{line['task']}: {line['input']!r} -> {line['output']}" for line in summary["serving"]]
    lines += ["```", "", "## Data", ""]
    sources = _json(paths.data / "sources.json")
    for entry in sources.values():
        lines.append(f"- **{entry['title']}**: `{entry['package']}=={entry['version']}` on PyPI; {entry['origin']}; "
                     f"license: {entry['license']}.")
    lines += ["", f"Details: `{paths.data.name}/SOURCES.md`; commands and times: `stages.json` and `logs/`.", ""]
    return "\n".join(lines)


def print_summary(paths, seconds: float):
    """The end of the demo: the results table, the comparison, where the report is, and the served answers."""
    summary = _json(paths.root / "summary.json")
    print(f"\n{'=' * 100}\nsinebert demo finished in {_time(seconds)} (this run).\n")
    width = max(len(row[0]) for row in summary["stages"])
    for stage, result, wall, rate in summary["stages"]:
        print(f"  {stage:<{width}}  {wall:>8}  {rate:>18} tok/s  {result}")
    print("\n  With and without pretraining (test splits):")
    for task, metric, pretrained, scratch, bag in summary["comparison"]:
        baseline = f"   TF-IDF + LR {bag:.3f}" if not math.isnan(bag) else ""
        print(f"    {metric:<17} pretrained {pretrained:.3f}   scratch {scratch:.3f}   "
              f"({pretrained - scratch:+.3f}){baseline}  {task}")
    print(f"\nReport: {paths.report} (pictures in {paths.figures})\n")
    for line in summary["serving"]:
        print(f"pipeline(\"{line['task']}\", model=\"{line['model']}\")({line['input']!r}) -> {line['output']}")
