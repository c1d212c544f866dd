"""sinebert at another checkout against this one, interleaved in one process: the A/B measurement of a change.

    git worktree add ../before <commit>
    python benchmarks/ab.py ../before                            # bf16 SST-2 dev inference
    python benchmarks/ab.py ../before --inference fp32
    python benchmarks/ab.py ../before --inference fp32 --batch_size 1   # one sentence at a time, as pipeline() serves
    python benchmarks/ab.py ../before --bf16_weights                # every model cast to bf16, no autocast
    python benchmarks/ab.py ../before --training small bf16      # pretraining steps on full blocks
    python benchmarks/ab.py ../before --training small bf16 --padded   # one padded row in every batch

Each version's model is built by its own code (the `sinebert` package and `benchmarks/speed.py` of its tree, loaded
one after the other into this process), the second given the first's weights, and their passes or steps alternate
with those of the fastest peer (BERT eager for inference, ModernBERT eager for training). The machine's drift, which
moved whole runs of the same code by a third within a day on the 2-core hosts here, so falls on all three alike.
Prints the median seconds of each and the ratios.
"""

import argparse
import importlib
import itertools
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parents[1]
# The trees' own modules, dropped between loads so that the second tree's imports do not find the first's.
OWN_MODULES = ("sinebert", "speed")


def speed_module(root: Path):
    """`benchmarks/speed.py` of the tree at `root`, importing that tree's `sinebert`."""
    for name in [name for name in sys.modules if name.split(".")[0] in OWN_MODULES]:
        del sys.modules[name]
    paths = [str(root), str(root / "benchmarks")]
    sys.path[:0] = paths
    try:
        speed = importlib.import_module("speed")
    finally:
        del sys.path[: len(paths)]
    for module in (speed, sys.modules["sinebert"]):
        if not Path(module.__file__).resolve().is_relative_to(root):
            raise SystemExit(f"{module.__name__} came from {module.__file__}, not from {root}: is it installed "
                             "non-editable? Run from a virtual environment with this repository installed editable.")
    return speed


def inference_runs(before, after, batch_size: int, dtype: torch.dtype) -> tuple[dict, object]:
    """One timed pass over the SST-2 dev sentences in batches of `batch_size` for each of before, after and BERT
    eager, their weights in `dtype`."""
    batches = after.inference_batches(after.sst2_dev(), batch_size)
    models = {"before": before.models("small", task="classification")[0].eval(),
              "after": after.models("small", task="classification")[0].eval(),
              "bert_eager": after.models("small", task="classification", bert_attention="eager")[1].eval()}
    copy_weights(models)
    for model in models.values():
        model.to(dtype)
    runs = {name: (lambda model=model: after.timed_pass(model, batches)) for name, model in models.items()}
    return runs, torch.no_grad()


def training_runs(before, after, size: str, precision: str, padded: bool) -> tuple[dict, object]:
    """One timed training step for each of before, after and ModernBERT eager, on 4 batches in turn."""
    models = {"before": before.models(size)[0], "after": after.models(size)[0],
              "modernbert_eager": after.modernbert(size, attention="eager")}
    copy_weights(models)
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for name, m in models.items()}
    generator = torch.Generator().manual_seed(0)
    batches = [after.masked_batch(generator) for _ in range(4)]
    if padded:  # the last sequence ends at 70 tokens, as the blocks that end a packing batch do
        for batch in batches:
            batch["attention_mask"] = torch.ones_like(batch["input_ids"])
            batch["attention_mask"][-1, 70:] = 0
            batch["labels"][-1, 70:] = -100
    turn = itertools.count()  # every model's step advances it; each round of the three shares a batch

    def step(name: str) -> float:
        batch = batches[next(turn) // len(models) % len(batches)]
        return after.seconds_of(lambda: after.train_step(models[name], optimizers[name], batch, precision))

    return {name: (lambda name=name: step(name)) for name in models}, nullcontext()


def copy_weights(models: dict):
    """The second version starts from the first's weights where their parameters match."""
    try:
        models["after"].load_state_dict(models["before"].state_dict())
    except RuntimeError as error:
        print(f"the two versions' parameters differ, each keeps its own initialisation: {error}".splitlines()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="The other checkout (e.g. a `git worktree`).")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--inference", choices=("fp32", "bf16"), default="bf16")
    what.add_argument("--training", nargs=2, metavar=("SIZE", "PRECISION"))
    parser.add_argument("--padded", action="store_true", help="With --training: one padded row in every batch.")
    parser.add_argument("--batch_size", type=int, default=32, help="With --inference: sentences per batch.")
    parser.add_argument("--bf16_weights", action="store_true",
                        help="Inference with every model's weights cast to bf16 instead of under autocast.")
    parser.add_argument("--repeats", type=int, default=10, help="Timed rounds, after one untimed.")
    args = parser.parse_args()
    root = args.before.resolve()
    if not (root / "benchmarks" / "speed.py").is_file() or not (root / "sinebert").is_dir():
        parser.error(f"{args.before}: not a sinebert checkout (no benchmarks/speed.py and sinebert/ there).")
    before, after = speed_module(root), speed_module(HERE)
    if args.training and args.bf16_weights:
        parser.error("--bf16_weights is for inference; training keeps float32 weights under autocast.")
    if args.training:
        size, precision = args.training
        if size not in after.SIZES or precision not in ("fp32", "bf16"):
            parser.error(f"--training {size} {precision}: SIZE is one of {', '.join(after.SIZES)}, PRECISION fp32 or "
                         "bf16.")
        runs, context = training_runs(before, after, size, precision, args.padded)
        label = f"training {size} {precision}{' padded' if args.padded else ''}"
    else:
        precision = "fp32" if args.bf16_weights else args.inference
        runs, context = inference_runs(before, after, args.batch_size,
                                       torch.bfloat16 if args.bf16_weights else torch.float32)
        label = (f"SST-2 dev inference {'bf16 weights' if args.bf16_weights else precision}, batches of "
                 f"{args.batch_size}")
    times = {name: [] for name in runs}
    with context, after.autocast(precision):
        for repeat in range(args.repeats + 1):
            for name, run in runs.items():
                seconds = run()
                if repeat:
                    times[name].append(seconds)
    median = {name: statistics.median(values) for name, values in times.items()}
    peer = list(runs)[2]
    print(f"{label}, median of {args.repeats}: " + ", ".join(f"{n} {s * 1000:.0f} ms" for n, s in median.items()))
    print(f"after / before: x{median['before'] / median['after']:.3f}; against {peer}: before "
          f"x{median[peer] / median['before']:.3f}, after x{median[peer] / median['after']:.3f}")


if __name__ == "__main__":
    main()
