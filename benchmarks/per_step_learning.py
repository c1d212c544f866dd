"""What a step learns, apart from how long it takes: held-out masked-token accuracy after the same number of steps.

    python benchmarks/per_step_learning.py                 # 800 steps, hidden 256 and 128: about 25 minutes
    python benchmarks/per_step_learning.py --steps 200 --hidden 256
    python benchmarks/per_step_learning.py --hidden 256 --contenders dropping dropping_loss   # dropping's policies
    python benchmarks/per_step_learning.py --hidden 256 --contenders rotary --learning_rate 2e-3   # another peak
    python benchmarks/per_step_learning.py --hidden 256 --contenders muon --muon_learning_rate 8e-3   # Muon's peak
    python benchmarks/per_step_learning.py --hidden 256 --contenders muon --mlm_probability 0.3   # training masks
    python benchmarks/per_step_learning.py --tiny --train_file tests/fixtures/sotu.txt   # seconds

By default sinebert with the cram's pretraining settings (configs/cram/pretrain.yaml) with rotary positions and with the
sinusoids added to the embeddings instead, and transformers' ModernBERT as benchmarks/speed.py builds it; `--contenders`
adds sinebert with a GLU feed-forward of the same FLOPs (time_to_accuracy.py's), sinebert with the standard or the
mimetic attention initialisation whatever the recipe's (`normal_init`, `mimetic_init`), sinebert with token dropping as
speed.py runs it, keeping a random share of the unmasked tokens or those of the highest running loss
(`token_dropping_policy`), sinebert without biases (`no_bias`) and sinebert trained with Muon (`muon`; `muon_fused`
orthogonalises each layer's query, key and value projections as one matrix; `muon_glu` with a GLU feed-forward). Each at
4 layers of `--hidden` width (4 heads, feed-forward 4 x hidden), from scratch on the cram's pretraining text: the same
batches and masks in the same order (benchmarks/time_to_accuracy.py's), the cram's optimizer (or time_to_accuracy.py's
Muon) and its schedule (warmup, then linear decay to 0) over `--steps` steps. Held-out accuracy on the cram's held-out
lines every quarter of the steps; seconds per step beside it (the models run one after another, so those are noisier
than speed.py's). Writes benchmarks/results/per_step_learning.{json,md}.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import speed  # noqa: E402
from benchmarks import time_to_accuracy as tta  # noqa: E402

# key: (label, time_to_accuracy.build name, overrides of the cram's settings)
CONTENDERS = {
    "rotary": ("sinebert, rotary positions", "sinebert", {"position_embedding_type": "rotary"}),
    "absolute": ("sinebert, added sinusoids", "sinebert", {"position_embedding_type": "absolute"}),
    "glu": ("sinebert, GLU feed-forward", "sinebert_glu", {}),
    "normal_init": ("sinebert, rotary positions, normal attention init", "sinebert",
                    {"position_embedding_type": "rotary", "attention_init": "normal"}),
    "mimetic_init": ("sinebert, rotary positions, mimetic attention init", "sinebert",
                     {"position_embedding_type": "rotary", "attention_init": "mimetic"}),
    "modernbert": ("ModernBERT", "modernbert", {}),
    "dropping": ("sinebert, token dropping (random)", "sinebert_dropping", {"token_dropping_policy": "random"}),
    "dropping_loss": ("sinebert, token dropping (by loss)", "sinebert_dropping", {"token_dropping_policy": "loss"}),
    "no_bias": ("sinebert, rotary positions, no biases", "sinebert",
                {"position_embedding_type": "rotary", "bias": False}),
    "muon": ("sinebert, Muon", "sinebert_muon", {}),
    "muon_fused": ("sinebert, Muon on the fused query-key-value", "sinebert_muon_fused", {}),
    "muon_glu": ("sinebert, Muon, GLU feed-forward", "sinebert_muon_glu", {}),
}
DEFAULT_CONTENDERS = ("rotary", "absolute", "modernbert")
QUARTERS = 4


def dims_at(hidden: int) -> dict:
    return dict(hidden_size=hidden, num_hidden_layers=4, num_attention_heads=4, intermediate_size=4 * hidden)


def train(model: torch.nn.Module, batches: tta.Batches, steps: int, precision: str, peak: float = tta.PEAK_LR,
          name: str = "sinebert", muon_peak: float | None = None) -> dict:
    """`steps` steps of the cram's schedule to the learning rate `peak` (with time_to_accuracy.py's optimizer for the
    contender `name`); accuracy (%) at each quarter and the median seconds of a step."""
    optimizer = tta.optimizer_of(name, model, peak, muon_peak)
    accuracy, seconds = [], []
    for step in range(steps + 1):
        if step % max(1, steps // QUARTERS) == 0 or step == steps:
            accuracy.append((step, round(100 * speed.masked_accuracy(model, batches.held, precision), 1)))
        if step == steps:
            break
        for group in optimizer.param_groups:
            group["lr"] = tta.learning_rate(step / steps, group["peak"])
        model.train()
        batch = batches(step)
        seconds.append(speed.seconds_of(lambda: speed.train_step(model, optimizer, batch, precision,
                                                                 tta.MAX_GRAD_NORM)))
    return {"accuracy": accuracy, "seconds_per_step": statistics.median(seconds)}


def markdown(report: dict) -> str:
    lines = [f"Per-step learning on {report['text']}, {report['date']}, {report['machine']}, {report['precision']}; "
             f"{report['steps']} steps of the cram's schedule, batches of {report['batch']} x {report['seq']} "
             f"masking {report.get('masking', speed.MASKING):.0%}, "
             f"held-out accuracy on {report['held_out_masked_tokens']:,} masked tokens. Command: "
             f"`{report['command']}`.", "",
             "| hidden | model | " + " | ".join(f"step {s}" for s, _ in report["runs"][0]["accuracy"]) +
             " | seconds per step |", "|---|---|" + "---|" * (len(report["runs"][0]["accuracy"]) + 1)]
    for run in report["runs"]:
        cells = " | ".join(f"{a:.1f}" for _, a in run["accuracy"])
        lines.append(f"| {run['hidden']} | {run['model']} | {cells} | {run['seconds_per_step']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=DEFAULT_CONTENDERS,
                        help="Which models to train, one after another (default: %(default)s).")
    parser.add_argument("--tiny", action="store_true", help="Hidden 32 and a 500-token vocabulary: checks it runs.")
    parser.add_argument("--learning_rate", type=tta.peak_learning_rate, default=tta.PEAK_LR,
                        help="The schedule's peak (default: the cram's, %(default)g).")
    tta.add_muon_argument(parser)
    tta.add_masking_argument(parser)
    tta.add_text_arguments(parser)
    args = parser.parse_args(argv)
    precision = tta.precision_here()
    train_lines, held_lines, text = tta.text_of(args)
    batches = tta.Batches.of(train_lines, held_lines, 500 if args.tiny else speed.VOCAB,
                             eval_blocks=tta.TINY_EVAL_BLOCKS if args.tiny else tta.EVAL_BLOCKS,
                             masking=args.mlm_probability)
    runs = []
    for hidden in [32] if args.tiny else args.hidden:
        for label, name, overrides in (CONTENDERS[key] for key in args.contenders):
            model = tta.build(name, batches.vocab, dims_at(hidden), precision, **overrides)
            runs.append({"hidden": hidden, "model": label,
                         **train(model, batches, args.steps, precision, args.learning_rate, name,
                                 args.muon_learning_rate)})
            print(json.dumps(runs[-1]), flush=True)
    report = {"text": text, "steps": args.steps, "precision": precision, **batches.report(), "runs": runs,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": speed.machine(),
              "command": "python benchmarks/per_step_learning.py " + " ".join(argv or sys.argv[1:])}
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / "per_step_learning.json").write_text(json.dumps(report, indent=1) + "\n")
    (output / "per_step_learning.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
