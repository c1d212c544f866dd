"""Time to accuracy on the cram's pretraining text: sinebert against transformers' ModernBERT, each by the clock.

    python benchmarks/time_to_accuracy.py               # ModernBERT 20 minutes, each sinebert 10: about 40 minutes
    python benchmarks/time_to_accuracy.py --minutes 4   # shorter
    python benchmarks/time_to_accuracy.py --contenders modernbert sinebert sinebert_dropping   # token dropping
    python benchmarks/time_to_accuracy.py --contenders modernbert sinebert --learning_rate 2e-3   # another peak
    python benchmarks/time_to_accuracy.py --contenders modernbert sinebert_muon --muon_learning_rate 8e-3   # Muon's
    python benchmarks/time_to_accuracy.py --mlm_probability 0.3   # every model masks 30% (held-out accuracy: 15%)

The question of issue 32: does sinebert reach, in half the time, the held-out masked-token accuracy that ModernBERT
reaches in the whole? ModernBERT gets `--minutes` of its own training seconds; sinebert (the cram's pretraining recipe),
sinebert with a GLU feed-forward of the same FLOPs (`mlp_type="glu"`, width 2/3 of the recipe's, as ModernBERT's) and,
if asked, sinebert with token dropping, with the mimetic attention initialisation (`sinebert_mimetic_init`, the recipe's
before 2026-12-04), without biases (`sinebert_no_bias`), trained with Muon (`sinebert_muon`, `--optim muon`) or with
Muon and token dropping (`sinebert_muon_dropping`) or a GLU (`sinebert_muon_glu`) get half as many. Every model has the
same size as the cram's (hidden 256, 4 layers, vocabulary 16,000, blocks of 128 tokens, global batch 32), sees the same
batches in the same order with the same masks (15% of the tokens, or `--mlm_probability`), and trains with the cram's
optimizer settings, read by `scripts/pretrain.py`'s own parser from configs/cram/pretrain.yaml (AdamW, or
`--optim muon`'s split for the Muon ones; its betas, weight decay, clipping and warmup; its peak learning rate or
`--learning_rate`), then linear decay to 0. The schedule runs on each model's own training clock, so each model's
learning rate reaches 0 exactly when its budget is spent, on whatever machine. The models take turns: the one that has
used the smallest share of its budget steps next, so a slow minute of a shared host falls on all of them alike.
Evaluation (on 256 blocks of the cram's held-out lines, fixed masks) is not on the clock.

sinebert starts from scratch here (no CBOW word embeddings: `make cram` spends 2 more minutes on those). ModernBERT
is as benchmarks/speed.py builds it (every layer global, masked-only head, GLU width 2/3 of BERT's feed-forward),
under the attention implementation that speed.py measured fastest here for the precision.

Writes benchmarks/results/time_to_accuracy.{json,md,png}.
"""

import argparse
import importlib.util
import json
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import speed  # noqa: E402
from recipes import cram_data  # noqa: E402
from sinebert import SineBertConfig, SineBertForMaskedLM  # noqa: E402
from sinebert.training.loop import cpu_has_native_bf16, muon_iteration_dtype  # noqa: E402
from sinebert.training.mlm import MaskingCollator, pack_texts  # noqa: E402
from sinebert.training.optimizer import MUON_LEARNING_RATE_RATIO, build_optimizer  # noqa: E402
from sinebert.training.tokenizer import train_wordpiece  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def recipe_arguments() -> argparse.Namespace:
    """The arguments `scripts/pretrain.py` runs the cram's recipe with: its own parser over the recipe's file, so
    that the races' optimizer settings and the script's cannot drift apart."""
    spec = importlib.util.spec_from_file_location("pretrain_script", ROOT / "scripts" / "pretrain.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script.parse_args(["--config_file", str(speed.RECIPE), "--output_dir", "unused"])


RECIPE_ARGUMENTS = recipe_arguments()
PEAK_LR, WEIGHT_DECAY, MAX_GRAD_NORM, WARMUP = (getattr(RECIPE_ARGUMENTS, key) for key in (
    "learning_rate", "weight_decay", "max_grad_norm", "warmup_ratio"))
EVAL_BLOCKS, EVALUATIONS = 256, 10
TINY_EVAL_BLOCKS = 32  # --tiny only checks that it runs: each evaluation 8 times shorter
# (name, label, share of --minutes): the peer gets the whole budget, sinebert half.
CONTENDERS = (("modernbert", "ModernBERT", 1.0), ("sinebert", "sinebert", 0.5),
              ("sinebert_glu", "sinebert, GLU feed-forward", 0.5),
              ("sinebert_dropping", "sinebert, token dropping", 0.5),
              ("sinebert_mimetic_init", "sinebert, mimetic attention init", 0.5),
              ("sinebert_no_bias", "sinebert, no biases", 0.5),
              ("sinebert_muon", "sinebert, Muon", 0.5),
              ("sinebert_muon_dropping", "sinebert, Muon and token dropping", 0.5),
              ("sinebert_muon_fused", "sinebert, Muon on the fused query-key-value", 0.5),
              ("sinebert_muon_glu", "sinebert, Muon and a GLU feed-forward", 0.5))
# The contenders trained with `--optim muon`; "sinebert_muon_fused" orthogonalises each layer's query, key and value
# projections as one matrix, as `--optim muon` did before 2026-12-06.
MUON = ("sinebert_muon", "sinebert_muon_dropping", "sinebert_muon_fused", "sinebert_muon_glu")
DEFAULT_CONTENDERS = ("modernbert", "sinebert", "sinebert_glu")
# Three layers: token dropping leaves out the first and the last.
TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64)


def number_in(text: str) -> float | None:
    """The number `text` spells, or None."""
    try:
        return float(text)
    except ValueError:
        return None


def peak_learning_rate(text: str) -> float:
    """argparse type of --learning_rate: a number of 0 (weights that never move, a baseline) or more."""
    value = number_in(text)
    if value is None or not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a learning rate; give a number of 0 or more, such as 1e-3.")
    return value


def masking_rate(text: str) -> float:
    """argparse type of --mlm_probability: a share of the tokens, between 0 and 1."""
    value = number_in(text)
    if value is None or not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share of tokens to mask; give a number between 0 and 1, "
                                         "such as 0.15.")
    return value


def learning_rate(share: float, peak: float = PEAK_LR) -> float:
    """The cram's schedule at `share` of a budget spent: linear warmup over WARMUP to `peak`, then linear decay to 0."""
    if share < WARMUP:
        return peak * share / WARMUP
    return peak * max(0.0, 1 - share) / (1 - WARMUP)


@dataclass
class Contender:
    name: str
    model: torch.nn.Module
    budget: float  # training seconds
    peak: float = PEAK_LR  # the schedule's peak learning rate
    muon_peak: float | None = None  # Muon's, for the contenders in MUON (None: MUON_LEARNING_RATE_RATIO x peak)
    optimizer: torch.optim.Optimizer = field(init=False)
    seconds: float = 0.0
    steps: int = 0
    curve: list = field(default_factory=list)  # (training seconds, steps, held-out accuracy)

    def __post_init__(self):
        self.optimizer = optimizer_of(self.name, self.model, self.peak, self.muon_peak)

    @property
    def share(self) -> float:
        return self.seconds / self.budget


def optimizer_of(name: str, model: torch.nn.Module, peak: float, muon_peak: float | None = None
                 ) -> torch.optim.Optimizer:
    """The optimizer `scripts/pretrain.py` builds with the cram's settings (`build_optimizer`: AdamW, or for those in
    MUON `--optim muon`'s MuonWithAdamW at `muon_peak`, by default MUON_LEARNING_RATE_RATIO x the peak; no decay on
    biases and norms; Muon iterating in the dtype the Trainer would pick on the model's device), each param group's
    schedule peak its learning rate. "sinebert_muon_fused" orthogonalises each fused weight as one matrix."""
    iteration_dtype, _ = muon_iteration_dtype(next(model.parameters()).device)
    settings = argparse.Namespace(**vars(RECIPE_ARGUMENTS) | {
        "optim": "muon" if name in MUON else "adamw", "learning_rate": peak, "muon_learning_rate": muon_peak})
    optimizer = build_optimizer(model, settings, iteration_dtype=iteration_dtype)
    if name == "sinebert_muon_fused":
        optimizer.parts["muon"].row_blocks = None  # every weight one matrix, as --optim muon did before 2026-12-06
    for group in optimizer.param_groups:
        group["peak"], group["lr"] = group["lr"], 0.0
    return optimizer


def next_contender(contenders: list[Contender]) -> Contender | None:
    """The contender with the smallest share of its budget spent, or None once every budget is spent."""
    running = [c for c in contenders if c.share < 1]
    return min(running, key=lambda c: c.share) if running else None


def train_step(contender: Contender, batch: dict, precision: str):
    """One clocked optimizer step at the learning rate of the share of the budget spent so far."""
    model, optimizer = contender.model, contender.optimizer
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(contender.share, group["peak"])
    model.train()
    contender.seconds += speed.seconds_of(lambda: speed.train_step(model, optimizer, batch, precision, MAX_GRAD_NORM))
    contender.steps += 1


def seconds_to_reach(curve: list, accuracy: float) -> float | None:
    """Training seconds at which `curve` first reaches `accuracy`, interpolated linearly; None if it never does."""
    for (t0, _, a0), (t1, _, a1) in zip(curve, curve[1:]):
        if a1 >= accuracy:
            return t0 + (t1 - t0) * (accuracy - a0) / (a1 - a0) if a1 > a0 else t1
    return None


def glu_settings(dims: dict) -> dict:
    """A GLU feed-forward of the FLOPs of `dims`' plain one: width 2/3 of its intermediate size, rounded to a
    multiple of 16 (bf16 products on a CPU are faster at such widths)."""
    return {"mlp_type": "glu", "intermediate_size": 16 * round(2 * dims["intermediate_size"] / 3 / 16)}


def modernbert_attention(precision: str) -> str:
    """ModernBERT's faster attention implementation in speed.py's pretraining rows: "eager" for bf16 on a CPU,
    "sdpa" otherwise (--modernbert_attention where speed.py measured otherwise)."""
    return "eager" if precision == "bf16" and speed.DEVICE.type == "cpu" else "sdpa"


def build(name: str, vocab: int, dims: dict, precision: str, attention: str = "sdpa", **overrides) -> torch.nn.Module:
    """ModernBERT (`name` "modernbert", under `attention`) or sinebert with the cram's pretraining settings, token
    dropping for "sinebert_dropping" and "sinebert_muon_dropping", a GLU feed-forward for "sinebert_glu" and
    "sinebert_muon_glu", the mimetic attention initialisation for "sinebert_mimetic_init" (the recipe's before
    2026-12-04), no biases for "sinebert_no_bias", and `overrides` of them."""
    torch.manual_seed(0)
    if name == "modernbert":
        config = speed.modernbert_config(dims, attention, vocab)
        return speed.ModernBertForMaskedLM(config).to(speed.DEVICE)
    glu = glu_settings(dims)
    extra = {"sinebert_dropping": speed.TOKEN_DROPPING, "sinebert_muon_dropping": speed.TOKEN_DROPPING,
             "sinebert_glu": glu, "sinebert_muon_glu": glu,
             "sinebert_mimetic_init": {"attention_init": "mimetic"}, "sinebert_no_bias": {"bias": False}}.get(name, {})
    config = SineBertConfig(**dims | speed.pretraining_settings() | extra | overrides, vocab_size=vocab,
                            max_position_embeddings=512)
    return SineBertForMaskedLM(config).to(speed.DEVICE)


def blocks_of(lines: list[str], tokenizer, seq: int) -> list[list[int]]:
    return [block for block in pack_texts(lines, tokenizer, seq) if len(block) == seq]


@dataclass
class Batches:
    """The text as every contender sees it: a WordPiece vocabulary trained on the training lines, their blocks in one
    shuffled order with masks drawn per block and epoch, and `eval_blocks` held-out blocks with fixed masks."""

    vocab: int
    train: list
    held: dict
    batch_size: int
    collator: MaskingCollator
    order: list = field(init=False)

    def __post_init__(self):
        self.order = torch.randperm(len(self.train), generator=torch.Generator().manual_seed(0)).tolist()

    @classmethod
    def of(cls, train_lines: list[str], held_lines: list[str], vocab: int, seq: int = speed.SEQ,
           batch_size: int = speed.BATCH, eval_blocks: int = EVAL_BLOCKS, masking: float = speed.MASKING
           ) -> "Batches":
        """`masking`: the share of tokens the training batches mask; the held-out blocks always mask the cram's."""
        tokenizer = train_wordpiece(train_lines, vocab_size=vocab)
        blocks = blocks_of(held_lines, tokenizer, seq)[:eval_blocks]
        held = MaskingCollator(tokenizer, speed.MASKING, seed=1, epoch=None)(
            [{"input_ids": b, "example_id": i} for i, b in enumerate(blocks)])
        return cls(len(tokenizer), blocks_of(train_lines, tokenizer, seq),
                   {key: value.to(speed.DEVICE) for key, value in held.items()}, batch_size,
                   MaskingCollator(tokenizer, masking, seed=0))

    def __call__(self, step: int) -> dict:
        """Batch `step` of the shared order: each block keeps its own mask within an epoch, new ones the next."""
        per_epoch = len(self.train) // self.batch_size
        self.collator.set_epoch(step // per_epoch)
        rows = self.order[(step % per_epoch) * self.batch_size:][:self.batch_size]
        masked = self.collator([{"input_ids": self.train[i], "example_id": i} for i in rows])
        return {key: value.to(speed.DEVICE) for key, value in masked.items()}

    def report(self) -> dict:
        return {"vocab": self.vocab, "seq": len(self.train[0]), "batch": self.batch_size,
                "masking": self.collator.mlm_probability,
                "train_blocks": len(self.train), "held_out_blocks": len(self.held["input_ids"]),
                "held_out_masked_tokens": int((self.held["labels"] != -100).sum())}


def run(train_lines: list[str], held_lines: list[str], minutes: float, precision: str, dims: dict, vocab: int,
        names: tuple = DEFAULT_CONTENDERS, attention: str = "sdpa", peak: float = PEAK_LR,
        eval_blocks: int = EVAL_BLOCKS, muon_peak: float | None = None, masking: float = speed.MASKING) -> dict:
    batches = Batches.of(train_lines, held_lines, vocab, eval_blocks=eval_blocks, masking=masking)
    contenders = [Contender(name, build(name, batches.vocab, dims, precision, attention), 60 * minutes * share, peak,
                            muon_peak) for name, _, share in CONTENDERS if name in names]
    marks = {c.name: 0 for c in contenders}  # evaluations done
    while (contender := next_contender(contenders)) is not None:
        if contender.share >= marks[contender.name] / EVALUATIONS:
            accuracy = speed.masked_accuracy(contender.model, batches.held, precision)
            contender.curve.append((contender.seconds, contender.steps, accuracy))
            marks[contender.name] += 1
            print(f"  {contender.name}: {contender.seconds:6.0f} s, step {contender.steps}, {100 * accuracy:.1f}%",
                  flush=True)
        train_step(contender, batches(contender.steps), precision)
    for contender in contenders:  # the end of each budget
        contender.curve.append((contender.seconds, contender.steps,
                                speed.masked_accuracy(contender.model, batches.held, precision)))
    return {
        "minutes": minutes, "precision": precision, "dims": dims, **batches.report(),
        "modernbert_attention": attention, "peak_learning_rate": peak, "muon_peak_learning_rate": muon_peak,
        "curves": {c.name: {"budget_seconds": c.budget, "steps": c.steps, "points": c.curve} for c in contenders},
    }


def verdict(report: dict) -> dict:
    """ModernBERT's accuracy at the end of its budget, each sinebert's at the end of its (half) budget and the
    seconds it took to reach ModernBERT's final accuracy (None if it did not), and whether the target holds."""
    curves = report["curves"]
    target = curves["modernbert"]["points"][-1][2]
    result = {"modernbert_accuracy": target, "modernbert_seconds": curves["modernbert"]["points"][-1][0]}
    for name, _ in contenders_in(report)[1:]:  # every sinebert (ModernBERT comes first)
        points = curves[name]["points"]
        result[f"{name}_accuracy"] = points[-1][2]
        result[f"{name}_seconds_to_target"] = seconds_to_reach(points, target)
        result[f"{name}_meets_target"] = points[-1][2] >= target
    return result


def contenders_in(report: dict) -> list[tuple[str, str]]:
    """(name, label) of the contenders that ran, in CONTENDERS' order."""
    return [(name, label) for name, label, _ in CONTENDERS if name in report["curves"]]


def markdown(report: dict) -> str:
    result, curves, ran = report["verdict"], report["curves"], contenders_in(report)
    lines = [
        f"Time to accuracy on {report['text']}, {report['date']}, {report['machine']}, {report['precision']};"
        f" hidden {report['dims']['hidden_size']}, {report['dims']['num_hidden_layers']} layers, vocabulary "
        f"{report['vocab']:,}, batches of {report['batch']} x {report['seq']} masking "
        f"{report.get('masking', speed.MASKING):.0%} of the tokens; held-out accuracy on "
        f"{report['held_out_masked_tokens']:,} masked tokens; peak learning rate "
        f"{report.get('peak_learning_rate', PEAK_LR):g}. Command: `{report['command']}`.",
        "",
        "| model | budget (min) | steps | tokens (M) | held-out accuracy at the end, % "
        "| seconds to reach ModernBERT's |",
        "|---|---|---|---|---|---|",
    ]
    for name, label in ran:
        curve = curves[name]
        reach = result.get(f"{name}_seconds_to_target")
        reach = "-" if name == "modernbert" else ("not reached" if reach is None else f"{reach:.0f}")
        lines.append(f"| {label} | {curve['budget_seconds'] / 60:g} | {curve['steps']:,} | "
                     f"{curve['steps'] * report['batch'] * report['seq'] / 1e6:.2f} | "
                     f"{100 * curve['points'][-1][2]:.1f} | {reach} |")
    lines += ["", "| share of the budget | " + " | ".join(label for _, label in ran) + " |",
              "|---|" + "---|" * len(ran)]
    for i in range(len(curves["modernbert"]["points"])):
        cells = []
        for name, _ in ran:
            points = curves[name]["points"]
            cells.append(f"{100 * points[i][2]:.1f} ({points[i][0]:.0f} s)" if i < len(points) else "")
        lines.append(f"| {min(i, EVALUATIONS) / EVALUATIONS:.0%} | " + " | ".join(cells) + " |")
    for name, label in ran[1:]:
        met = "met" if result[f"{name}_meets_target"] else "not met"
        lines.append("")
        lines.append(f"{label} after {curves[name]['budget_seconds'] / 60:g} minutes: "
                     f"{100 * result[f'{name}_accuracy']:.1f}% against ModernBERT's "
                     f"{100 * result['modernbert_accuracy']:.1f}% after {result['modernbert_seconds'] / 60:.1f}: "
                     f"target {met}.")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4))
    for (name, label), style in zip(contenders_in(report), ("d-", "s-", "^-", "o-", "v-", "x-", "+-")):
        points = report["curves"][name]["points"]
        axis.plot([p[0] / 60 for p in points], [100 * p[2] for p in points], style, label=label)
    axis.set_xlabel("training minutes (each model's own clock)")
    axis.set_ylabel("held-out masked-token accuracy (%)")
    axis.set_title(f"{report['text']}, {report['precision']}, the same batches")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def cram_text(work: Path) -> tuple[list[str], list[str]]:
    """The cram's pretraining lines and its held-out lines, prepared as `make cram` prepares them."""
    data = cram_data.CramData(work / "data")
    if not data.pretrain_validation.is_file():
        cram_data.prepare(speed.DATA, data, work / "cache")
    return nonblank_lines(data.pretrain_train), nonblank_lines(data.pretrain_validation)


def nonblank_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def add_muon_argument(parser: argparse.ArgumentParser):
    parser.add_argument("--muon_learning_rate", type=peak_learning_rate, default=None,
                        help="The Muon contenders' peak for their Muon matrices (default: "
                             f"{MUON_LEARNING_RATE_RATIO} x --learning_rate, as --optim muon's).")


def add_masking_argument(parser: argparse.ArgumentParser):
    parser.add_argument("--mlm_probability", type=masking_rate, default=speed.MASKING,
                        help="The share of tokens every model's training batches mask (default: the cram's, "
                             "%(default)g; ModernBERT's own recipe masks 0.3). Held-out accuracy stays on the cram's.")


def add_text_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--work_dir", default=None, help="Where the cram's text is prepared (a temporary folder).")
    parser.add_argument("--train_file", help="Lines of text to train on instead of the cram's (with --held_out_file).")
    parser.add_argument("--held_out_file", help="Held-out lines for --train_file (by default its own lines).")
    parser.add_argument("--output_dir", default=str(RESULTS))


def text_of(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    """The training lines, the held-out lines and their name: --train_file's, or the cram's (prepared in
    --work_dir, else in a temporary folder)."""
    if args.train_file:
        held = args.held_out_file or args.train_file
        return nonblank_lines(Path(args.train_file)), nonblank_lines(Path(held)), Path(args.train_file).name
    with tempfile.TemporaryDirectory() as scratch:
        return *cram_text(Path(args.work_dir or scratch)), "the cram's pretraining text"


def precision_here() -> str:
    return "bf16" if speed.DEVICE.type == "cuda" or cpu_has_native_bf16() else "fp32"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0, help="ModernBERT's budget; sinebert gets half.")
    parser.add_argument("--tiny", action="store_true", help="Tiny models and vocabulary: checks that it runs.")
    parser.add_argument("--contenders", nargs="+", choices=[name for name, _, _ in CONTENDERS],
                        default=DEFAULT_CONTENDERS, help="Which models race (default: %(default)s); ModernBERT always.")
    parser.add_argument("--modernbert_attention", choices=("sdpa", "eager"),
                        help="ModernBERT's attention (default: the faster in speed.py's rows, eager for bf16 on a CPU, "
                             "else sdpa).")
    parser.add_argument("--learning_rate", type=peak_learning_rate, default=PEAK_LR,
                        help="Every model's peak learning rate (default: the cram's, %(default)g).")
    add_muon_argument(parser)
    add_masking_argument(parser)
    add_text_arguments(parser)
    args = parser.parse_args(argv)
    if "modernbert" not in args.contenders:
        parser.error("--contenders must include modernbert, the accuracy every sinebert is held to.")
    precision = precision_here()
    train_lines, held_lines, text = text_of(args)
    dims = TINY if args.tiny else speed.SIZES["small"]
    report = run(train_lines, held_lines, args.minutes, precision, dims, 500 if args.tiny else speed.VOCAB,
                 tuple(args.contenders), args.modernbert_attention or modernbert_attention(precision),
                 args.learning_rate, TINY_EVAL_BLOCKS if args.tiny else EVAL_BLOCKS, args.muon_learning_rate,
                 args.mlm_probability)
    report |= {"text": text, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": speed.machine(),
               "torch": torch.__version__, "platform": platform.platform(),
               "command": "python benchmarks/time_to_accuracy.py " + " ".join(argv or sys.argv[1:])}
    report["verdict"] = verdict(report)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / "time_to_accuracy.json").write_text(json.dumps(report, indent=1) + "\n")
    (output / "time_to_accuracy.md").write_text(markdown(report))
    plot(report, output / "time_to_accuracy.png")
    print(markdown(report))


if __name__ == "__main__":
    main()
