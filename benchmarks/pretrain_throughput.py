"""End-to-end pretraining throughput of scripts/pretrain.py through `accelerate launch`.

    python benchmarks/pretrain_throughput.py            # fp32 and bf16, one and two processes
    python benchmarks/pretrain_throughput.py --quick    # a few steps, to check the benchmark runs
    python benchmarks/pretrain_throughput.py --launches 2:fp32 --optim adamw muon --rounds 2   # AdamW against Muon

Runs the real script (data loading, masking, optimizer, logging) with the settings of the CPU cram's pretraining
(configs/cram/pretrain.yaml) for a fixed number of steps on the unlabelled text of the training splits in
../shared/data, and reads the tokens/s it logged after a warm-up window. Beside each run, in this process on every
core, it times the bare step as benchmarks/speed.py does (forward, backward, clipping, fused AdamW on synthetic
batches of the same shape) of a fresh model built from the config the script saved, after the run and (from the second
run on) before it, so that the host's drift hits both, and reports the script's tokens/s as a share of the bare
step's: what the data pipeline, masking, logging and, with two processes, the gradient all-reduce (which the results
name) cost. It also times, the same way, the bare step in the script's own layout (with two processes or more, as
many under DDP, each with its share of the batch and of the cores, the gradients averaged as the script averages
them), so that the script's share of that step is what its data pipeline, masking and logging cost alone. Writes
benchmarks/results/pretrain_throughput.{json,md} (or --output_name's).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.speed import cpu_name, masked_batch, seconds_of, train_step  # noqa: E402
from sinebert import SineBertConfig, SineBertForMaskedLM  # noqa: E402
from sinebert.training.all_reduce import register_gradient_all_reduce  # noqa: E402
from sinebert.training.loop import DDP_OPTIONS  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"
RECIPE = ROOT / "configs" / "cram" / "pretrain.yaml"  # hidden 256, 4 layers, 4 heads, FFN 1024, seq 128, no dropout


def training_text(folder: Path, max_lines: int) -> Path:
    """SST-2 train sentences and CoNLL-2003 train sentences: unlabelled text of training splits only."""
    lines = [row.split("\t")[0] for row in (DATA / "sst2" / "train.tsv").read_text().splitlines()[1:]]
    sentence = []
    for row in (DATA / "conll2003" / "train.txt").read_text().splitlines():
        if row.strip():
            sentence.append(row.split()[0])
        elif sentence:
            lines.append(" ".join(sentence))
            sentence = []
    path = folder / "train.txt"
    path.write_text("\n".join(lines[:max_lines]) + "\n")
    return path


def launch(processes: int, precision: str, args: list[str]) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--dynamo_backend", "no",
                "--mixed_precision", precision]
    if processes == 1:
        launcher += ["--num_processes", "1", "--num_cpu_threads_per_process", str(os.cpu_count())]
    else:
        launcher += ["--multi_gpu", "--num_processes", str(processes),
                     "--num_cpu_threads_per_process", str(max(1, os.cpu_count() // processes))]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([*launcher, str(ROOT / "scripts" / "pretrain.py"), *args], capture_output=True, text=True,
                            env=env, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"pretraining failed:\n{result.stderr[-3000:]}")
    return result


def bare_step_times(config: SineBertConfig, precision: str, batch: int, steps: int, warmup: int = 3,
                    rank: int = 0, threads: int | None = None) -> list[float]:
    """Seconds of `steps` bare training steps (after `warmup`) of a fresh model built from `config`, on `threads`
    threads (every core by default): the recipe's clipping (1.0) and the fused AdamW the script's Trainer uses, on
    speed.py's masked batch of `batch` rows of 128 random tokens (15% masked and predicted, as in the script's blocks;
    drawn from seed `rank`). Under an initialised process group the model runs under DDP as the script runs it, with
    its gradient all-reduce."""
    torch.set_num_threads(threads or os.cpu_count())
    torch.manual_seed(0)
    model = SineBertForMaskedLM(config).train()
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model, **DDP_OPTIONS)
        register_gradient_all_reduce(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    inputs = masked_batch(torch.Generator().manual_seed(rank), rows=batch, vocab=config.vocab_size)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])  # as the script's collator passes it
    times = [seconds_of(lambda: train_step(model, optimizer, inputs, precision, max_grad_norm=1.0))
             for _ in range(warmup + steps)]
    return times[warmup:]


def layout_step_times(config: SineBertConfig, precision: str, batch: int, steps: int, processes: int) -> list[float]:
    """`bare_step_times` in the script's layout: `processes` processes under DDP over gloo, each with batch //
    processes rows and cpu_count // processes threads, as `launch` starts them; the first process's seconds."""
    with tempfile.TemporaryDirectory() as folder:
        seconds = mp.get_context("spawn").SimpleQueue()
        mp.start_processes(_layout_process, args=(processes, folder, seconds, config, precision, batch, steps),
                           nprocs=processes, start_method="spawn")
        return seconds.get()


def _layout_process(rank: int, processes: int, folder: str, seconds, config, precision: str, batch: int, steps: int):
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=processes)
    try:
        times = bare_step_times(config, precision, batch // processes, steps, rank=rank,
                                threads=max(1, os.cpu_count() // processes))
    finally:
        dist.destroy_process_group()
    if rank == 0:
        seconds.put(times)


def step_times(config: SineBertConfig, precision: str, batch: int, steps: int, processes: int) -> tuple[list, list]:
    """Seconds of the bare step on every core, and in the script's layout (for one process, the same)."""
    bare = bare_step_times(config, precision, batch, steps)
    return bare, (layout_step_times(config, precision, batch, steps, processes) if processes > 1 else list(bare))


def measure(processes: int, precision: str, data: Path, tokenizer: Path, work: Path, steps: int, batch: int,
            optim: str = "adamw") -> dict:
    out = work / f"run_{processes}_{precision}_{optim}"
    bare_precision = "bf16" if precision == "bf16" else "fp32"
    # The bare steps are timed before the run (once the first run has saved the model's config) and after it.
    config = SineBertConfig.from_pretrained(work) if (work / "config.json").exists() else None
    bare, layout = step_times(config, bare_precision, batch, steps // 2, processes) if config else ([], [])
    start = time.perf_counter()
    launch(processes, precision, [
        "--config_file", str(RECIPE), "--train_file", str(data), "--tokenizer_name", str(tokenizer),
        "--per_device_train_batch_size", str(batch // processes),
        "--max_train_tokens", str(steps * batch * 128),  # the recipe's budget is in tokens: this many steps of it
        "--logging_steps", str(max(1, steps // 8)), "--eval_steps", str(10 * steps), "--max_eval_samples", "64",
        "--output_dir", str(out), "--overwrite_output_dir", "--optim", optim,
    ])
    wall = time.perf_counter() - start
    if config is None:
        config = SineBertConfig.from_pretrained(out)
        config.save_pretrained(work)
    after = step_times(config, bare_precision, batch, steps // 2, processes)
    bare, layout = bare + after[0], layout + after[1]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    averaged_by = json.loads((out / "all_results.json").read_text())["gradient_all_reduce"]  # None: one process
    windows = [r["tokens_per_second"] for r in rows if "tokens_per_second" in r][1:]  # first window: warm-up
    script, step = statistics.median(windows), batch * 128 / statistics.median(bare)
    in_layout = batch * 128 / statistics.median(layout)
    return {
        "processes": processes, "precision": precision, "optim": optim, "tokens_per_second": script,
        "bare_step_tokens_per_second": step, "share_of_bare_step": script / step,
        "layout_step_tokens_per_second": in_layout, "share_of_layout_step": script / in_layout,
        "steps": steps, "global_batch": batch, "wall_seconds": round(wall, 1), "gradient_all_reduce": averaged_by,
    }


def launch_of(text: str) -> tuple[int, str]:
    """--launches' PROCESSES:PRECISION as (processes, the script's --mixed_precision)."""
    processes, _, precision = text.partition(":")
    if not processes.isdigit() or int(processes) < 1 or precision not in ("fp32", "bf16"):
        raise argparse.ArgumentTypeError(f"{text!r} is not PROCESSES:PRECISION; write e.g. 2:fp32 or 1:bf16")
    return int(processes), "no" if precision == "fp32" else "bf16"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="A few steps of one configuration.")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--bf16_steps", type=int, default=48,
                        help="Steps of the bf16 runs: fewer on CPUs without native bf16 matmuls (no AVX512-BF16 or "
                             "AMX), which run them many times slower.")
    parser.add_argument("--batch", type=int, default=32, help="Global batch (split over processes).")
    parser.add_argument("--launches", nargs="+", type=launch_of,
                        default=[(1, "no"), (1, "bf16"), (2, "no"), (2, "bf16")],
                        help="PROCESSES:PRECISION pairs to run (precision fp32 or bf16), e.g. 2:fp32.")
    parser.add_argument("--optim", nargs="+", default=["adamw"], choices=["adamw", "muon"],
                        help="The script's --optim for each launch; the bare step is always fused AdamW's.")
    parser.add_argument("--rounds", type=int, default=1, help="Times to run every launch and optimizer, in turn.")
    parser.add_argument("--output_name", default="pretrain_throughput",
                        help="The results' file name in benchmarks/results (.json and .md).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = training_text(work, 20000)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "train_tokenizer.py"), "--train_file", str(data),
                        "--vocab_size", "16000", "--output_dir", str(work / "tokenizer")], check=True,
                       capture_output=True)
        configs = [(1, "no")] if args.quick else args.launches
        steps = {"no": 10 if args.quick else args.steps, "bf16": args.bf16_steps}
        results = [measure(p, precision, data, work / "tokenizer", work, steps[precision], args.batch, optim)
                   for _ in range(args.rounds) for p, precision in configs for optim in args.optim]
    report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{cpu_name()}, {os.cpu_count()} cores",
              "model": "configs/cram/pretrain.yaml: hidden 256, 4 layers, 4 heads, FFN 1024, vocab 16000, seq 128",
              "results": results}
    if args.quick:
        print(json.dumps(report, indent=2))
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.output_name}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"Pretraining throughput of scripts/pretrain.py ({report['model']}, global batch {args.batch}), "
             f"{report['date']}, {report['machine']}.", "",
             "| processes | precision | optimizer | script tokens/s | bare step tokens/s | script / bare step "
             "| bare step in the script's layout | script / it | steps | gradient all-reduce |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['processes']} | {'fp32' if r['precision'] == 'no' else r['precision']} | {r['optim']} | "
              f"{r['tokens_per_second']:,.0f} | {r['bare_step_tokens_per_second']:,.0f} | "
              f"{r['share_of_bare_step']:.1%} | {r['layout_step_tokens_per_second']:,.0f} | "
              f"{r['share_of_layout_step']:.1%} | {r['steps']} | {r['gradient_all_reduce'] or '-'} |" for r in results]
    (RESULTS / f"{args.output_name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
