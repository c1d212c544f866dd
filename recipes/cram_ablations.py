"""Short proxy experiments for the cram recipe: each lever against configs/cram/pretrain.yaml at an equal number of
pretraining tokens, so that the machine's load changes the time a run takes but not its result.

    python -m recipes.cram_ablations                         # every ablation (about 8 minutes each on 2 busy cores)
    python -m recipes.cram_ablations --only base batch8      # some of them
    python -m recipes.cram_ablations --tokens 1000000        # a longer proxy

Each ablation pretrains for --tokens tokens (steps = tokens / (global batch x sequence length), the step schedule of
the recipe), then fine-tunes an SST-2 probe from it: 400 steps on SST-2 train rows 1-20,000, scored on the last
2,000 train rows, never on dev. It reports the MLM validation loss on the cram's held-out 1% (comparable between runs
of the same masking rate) and the probe accuracy. Needs the cram's data and tokenizer (it runs those stages first).
Appends to benchmarks/results/cram_ablations.jsonl and rewrites cram_ablations.md.
"""

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import yaml

from sinebert.training.arguments import read_config_file
from sinebert.training.errors import UserError, run_cli

from .cram import CONFIGS, ROOT, run_cram
from .stages import decide_launch

RESULTS = ROOT / "benchmarks" / "results"
# name: values that replace those of configs/cram/pretrain.yaml
ABLATIONS = {
    "base": {},
    "lr2e-3": {"learning_rate": 2e-3},
    "lr5e-4": {"learning_rate": 5e-4},
    "mask30": {"mlm_probability": 0.3},
    "batch8": {"per_device_train_batch_size": 8},
    "batch4": {"per_device_train_batch_size": 4},
    "seq64": {"max_seq_length": 64},
    "dropout0.1": {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1},
    "post-ln": {"norm_placement": "post", "learning_rate": 5e-4},
    "unscaled-embeddings": {"scale_embeddings": False},
    # A narrow window in every layer makes the neighbours easy to find (see benchmarks/plateau.py).
    "local8": {"sliding_window": 8},
    "local8-batch4": {"sliding_window": 8, "per_device_train_batch_size": 4},
}
PROBE_STEPS, PROBE_TRAIN_ROWS, PROBE_VALIDATION_ROWS = 400, 20000, 2000


def ablation_config(name: str, folder: Path) -> tuple[Path, dict]:
    """configs/cram/pretrain.yaml with the ablation's values, written to `folder`; returns its path and values."""
    values = {**read_config_file(str(CONFIGS / "pretrain.yaml")), **ABLATIONS[name]}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path, values


def pretraining_steps(tokens: int, values: dict, processes: int) -> int:
    """Optimizer steps that make `tokens` pretraining tokens with this ablation's batch and sequence length."""
    return max(1, tokens // (values["per_device_train_batch_size"] * processes * values["max_seq_length"]))


def probe_split(shared: Path, folder: Path) -> tuple[Path, Path]:
    """The SST-2 probe's data: training rows only (dev stays untouched for the cram's own score)."""
    lines = (shared / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    folder.mkdir(parents=True, exist_ok=True)
    train, validation = folder / "probe_train.tsv", folder / "probe_validation.tsv"
    train.write_text("\n".join([lines[0], *lines[1 : 1 + PROBE_TRAIN_ROWS]]) + "\n", encoding="utf-8")
    validation.write_text("\n".join([lines[0], *lines[-PROBE_VALIDATION_ROWS:]]) + "\n", encoding="utf-8")
    return train, validation


def run_logged(command: list[str], log: Path, env: dict):
    with log.open("w") as file:
        if subprocess.run(command, stdout=file, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode:
            raise UserError(f"{command[command.index('--output_dir') + 1]} failed; its output is in {log}.")


def ablate(name: str, tokens: int, work: Path, probe: tuple[Path, Path], launch, env: dict) -> dict:
    config, values = ablation_config(name, work)
    steps = pretraining_steps(tokens, values, launch.processes)
    cram, out, load = ROOT / "runs" / "cram", work / name, os.getloadavg()
    started = time.perf_counter()
    run_logged(launch.command("pretrain.py") + [
        "--config_file", str(config), "--train_file", str(cram / "data" / "pretrain" / "train.txt"),
        "--validation_file", str(cram / "data" / "pretrain" / "validation.txt"), "--tokenizer_name",
        str(cram / "tokenizer"), "--max_train_steps", str(steps), "--eval_steps", str(max(1, steps // 4)),
        "--checkpointing_steps", str(10 * steps), "--output_dir", str(out / "pretrain"), "--overwrite_output_dir",
    ], work / f"{name}.pretrain.log", env)
    minutes = (time.perf_counter() - started) / 60
    run_logged(launch.command("finetune_classification.py") + [
        "--config_file", str(CONFIGS / "sst2.yaml"), "--train_file", str(probe[0]), "--validation_file", str(probe[1]),
        "--model_name_or_path", str(out / "pretrain"), "--max_train_steps", str(PROBE_STEPS), "--eval_steps",
        str(10 * PROBE_STEPS), "--checkpointing_steps", str(10 * PROBE_STEPS), "--output_dir", str(out / "probe"),
        "--overwrite_output_dir",
    ], work / f"{name}.probe.log", env)
    pretrained = json.loads((out / "pretrain" / "all_results.json").read_text())
    probed = json.loads((out / "probe" / "all_results.json").read_text())
    return {
        "name": name, "changes": ABLATIONS[name], "tokens": pretrained["train_tokens"],
        "steps": pretrained["train_steps"], "mlm_validation_loss": round(pretrained["eval_loss"], 4),
        "mlm_validation_accuracy": round(pretrained["eval_accuracy"], 4),
        "tokens_per_second": round(pretrained["train_tokens_per_second"]), "probe_accuracy": probed["eval_accuracy"],
        "pretrain_wall_minutes": round(minutes, 1), "load_average": [round(x, 1) for x in load + os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| ablation | changes to configs/cram/pretrain.yaml | tokens | steps | MLM val. loss | MLM val. acc. | "
             "probe acc. | tokens/s | load (1/5/15 min, start; end) | date |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        load = r["load_average"]
        changes = ", ".join(f"{key}: {value}" for key, value in r["changes"].items()) or "-"
        lines.append(f"| {r['name']} | {changes} | {r['tokens']:,} | {r['steps']} | "
                     f"{r['mlm_validation_loss']:.3f} | {r['mlm_validation_accuracy']:.3f} | "
                     f"{100 * r['probe_accuracy']:.1f} | {r['tokens_per_second']:,} | "
                     f"{'/'.join(map(str, load[:3]))}; {'/'.join(map(str, load[3:]))} | {r['date']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(ABLATIONS), help="Run only these ablations.")
    parser.add_argument("--tokens", type=int, default=600_000, help="Pretraining tokens of every ablation.")
    parser.add_argument("--work_dir", default="runs/cram-ablations")
    args = parser.parse_args(argv)
    run_cram("full", stop_after="tokenizer", command="python -m recipes.cram_ablations")
    work = Path(args.work_dir)
    probe = probe_split(ROOT.parent / "shared" / "data", work)
    launch = decide_launch()
    env = launch.env()
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = RESULTS / "cram_ablations.jsonl"
    for name in args.only or ABLATIONS:
        row = ablate(name, args.tokens, work, probe, launch, env)
        print(json.dumps(row), flush=True)
        with log.open("a") as file:
            file.write(json.dumps(row) + "\n")
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        (RESULTS / "cram_ablations.md").write_text(markdown(rows))


if __name__ == "__main__":
    run_cli(main)
