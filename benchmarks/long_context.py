"""Long inputs: time and peak memory of full versus local attention, beside transformers' ModernBERT with the same
local layers, and how far sinusoidal positions extrapolate.

    python benchmarks/long_context.py speed          # one forward pass, L = 512 .. 32k, each in a fresh process
    python benchmarks/long_context.py extrapolation  # pretrain at 128 tokens, masked-token accuracy at 128..2048
    python benchmarks/long_context.py all

Writes benchmarks/results/long_context_{speed,extrapolation}.{json,md,png}. Timings are wall-clock on whatever this
machine is also running; each JSON records the load average before and after.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sinebert.training.reporting import peak_rss_mib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # (benchmarks.speed, when run as a script)
RESULTS = ROOT / "benchmarks" / "results"
SHARED_DATA = ROOT.parent / "shared" / "data"
LENGTHS = (512, 2048, 8192, 32768)
# The model of the issue: 4 layers, hidden 256 (4 heads of 64), feed-forward 1024.
MODEL_SIZE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
# The extrapolation model is tiny: a few minutes of pretraining on 2 shared cores (~1M tokens) barely move a larger one
# off predicting the most frequent token.
EXTRAPOLATION_MODEL_SIZE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
VOCAB = 8192
EAGER_SCORE_LIMIT_GIB = 6.0  # eager attention materialises (heads, L, L) fp32 scores; beyond this it is not run


@dataclass(frozen=True)
class Setup:
    label: str
    attn_implementation: str
    local: dict = field(default_factory=dict)  # sinebert's settings of local attention
    model: str = "sinebert"  # or "modernbert": transformers' ModernBERT, the same layers local (`speed_model`)


SPEED_SETUPS = {
    "full_eager": Setup("full attention, eager", "eager"),
    "full_sdpa": Setup("full attention, SDPA", "sdpa"),
    "local_global": Setup(
        "local w=128 + full layers 0 and 3, [CLS] global", "sdpa",
        dict(sliding_window=128, global_attn_every_n_layers=3, global_attention_positions=[0]),
    ),
    "local": Setup(
        "local w=128 in every layer, [CLS] global", "sdpa", dict(sliding_window=128, global_attention_positions=[0])
    ),
    "modernbert_local_global": Setup(
        "ModernBERT, local w=128 + full layers 0 and 3", "sdpa",
        dict(sliding_window=128, global_attn_every_n_layers=3), "modernbert",
    ),
    "modernbert_local": Setup(
        "ModernBERT, local w=128 in every layer", "sdpa", dict(sliding_window=128), "modernbert"
    ),
}

EXTRAPOLATION_SETUPS = {
    "full": Setup("full attention (as pretrained)", "sdpa"),
    "local_global": Setup(
        "local w=64, full attention in every other layer (from layer 0), [CLS] global", "sdpa",
        dict(sliding_window=64, global_attn_every_n_layers=2, global_attention_positions=[0]),
    ),
    "local": Setup(
        "local w=64 in every layer, [CLS] global", "sdpa", dict(sliding_window=64, global_attention_positions=[0])
    ),
}


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


# ---------------------------------------------------------------- speed and memory


def speed_model(setup: Setup, length: int) -> torch.nn.Module:
    """sinebert in its pretraining recipe's architecture (pre-LN, rotary positions, no dropout), or ModernBERT of
    the same size (its GLU of the same FLOPs, `speed.modernbert_config`) with the same window on each side (its
    `local_attention` is the whole width) and the same layers full; ModernBERT has no global token in local layers."""
    from transformers import ModernBertModel

    from benchmarks.speed import modernbert_config, recipe_architecture
    from sinebert import SineBertConfig, SineBertModel

    torch.manual_seed(0)
    if setup.model == "modernbert":
        every, window = setup.local.get("global_attn_every_n_layers"), setup.local["sliding_window"]
        layers = ["full_attention" if every and i % every == 0 else "sliding_attention"
                  for i in range(MODEL_SIZE["num_hidden_layers"])]
        config = modernbert_config(MODEL_SIZE, setup.attn_implementation, VOCAB, max_position_embeddings=length,
                                   layer_types=layers, local_attention=2 * window)
        return ModernBertModel(config).eval()
    config = SineBertConfig(vocab_size=VOCAB, **MODEL_SIZE, **recipe_architecture(), **setup.local)
    return SineBertModel._from_config(config, attn_implementation=setup.attn_implementation).eval()


def measure(setup_name: str, length: int, threads: int | None) -> dict:
    """One configuration at one length, in this (fresh) process: median time of a no-grad forward pass and the
    process's peak resident memory."""
    if threads:
        torch.set_num_threads(threads)
    setup = SPEED_SETUPS[setup_name]
    model = speed_model(setup, length)
    kernels = ([f"{setup.attn_implementation}, masks"] if setup.model == "modernbert"
               else model.attention_kernels(input_shape=(1, length)))
    ids = torch.randint(5, VOCAB, (1, length))
    with torch.inference_mode():
        model(input_ids=ids[:, :512])  # warm-up: thread pool, allocator, kernel choice
        baseline = peak_rss_mib()
        times = timed_passes(lambda: model(input_ids=ids))
    return {
        "setup": setup_name, "label": setup.label, "length": length, "seconds": min(times),
        "median_seconds": statistics.median(times), "repeats": len(times),
        "us_per_token": min(times) / length * 1e6, "peak_rss_mib": peak_rss_mib(),
        "forward_mib": peak_rss_mib() - baseline, "kernels": kernels,
        "threads": torch.get_num_threads(),
    }


def timed_passes(run, budget_seconds: float = 30.0, max_repeats: int = 5) -> list[float]:
    """Wall-clock seconds of repeated passes: up to `max_repeats`, while another pass fits in `budget_seconds`. The
    fastest is reported: on a shared machine, other jobs only ever add time."""
    times = []
    while len(times) < max_repeats and (not times or sum(times) + times[-1] <= budget_seconds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def eager_scores_gib(length: int) -> float:
    return MODEL_SIZE["num_attention_heads"] * length * length * 4 / 2**30


def run_measurement(setup_name: str, length: int, timeout: int, threads: int | None) -> dict:
    """`measure` in a fresh interpreter, so that one configuration's peak memory cannot hide another's."""
    if setup_name == "full_eager" and eager_scores_gib(length) > EAGER_SCORE_LIMIT_GIB:
        return {"setup": setup_name, "length": length, "skipped": (
            f"not run: its (4, {length}, {length}) fp32 score matrix alone is {eager_scores_gib(length):.0f} GiB")}
    command = [sys.executable, __file__, "measure", "--setup", setup_name, "--length", str(length)]
    command += ["--threads", str(threads)] if threads else []
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"setup": setup_name, "length": length, "skipped": f"not finished within {timeout} s"}
    if result.returncode != 0:
        return {"setup": setup_name, "length": length, "skipped": f"failed: {result.stderr.strip()[-300:]}"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def speed(args) -> dict:
    rows = []
    load_before = load_average()
    for setup_name in SPEED_SETUPS:
        for length in args.lengths:
            row = run_measurement(setup_name, length, args.timeout, args.threads)
            rows.append(row)
            shown = row.get("skipped") or f"{row['seconds']:.2f} s, peak {row['peak_rss_mib']:.0f} MiB"
            print(f"{setup_name:>13} L={length:>6}: {shown}", flush=True)
    report = {"rows": rows, "load_average_before": load_before, "load_average_after": load_average(),
              "cpu_count": os.cpu_count(), "torch": torch.__version__, "model": MODEL_SIZE,
              "targets": speed_targets(rows)}
    write_report("long_context_speed", report, speed_table(report), plot_speed(rows))
    return report


def _row(rows, setup, length):
    return next((r for r in rows if r["setup"] == setup and r["length"] == length and "skipped" not in r), None)


def speed_targets(rows: list[dict]) -> dict:
    """The issue's targets, checked on each local setup: memory linear in L, 32k in under 4 GiB, and time per token
    at 32k within 2x of 2k."""
    targets = {}
    for setup in ("local_global", "local"):
        short, mid, long = _row(rows, setup, 2048), _row(rows, setup, 8192), _row(rows, setup, 32768)
        if not (short and mid and long):
            continue
        targets[setup] = {
            "forward_mib_ratio_32k_over_8k": long["forward_mib"] / max(mid["forward_mib"], 1e-9),
            "peak_gib_at_32k": long["peak_rss_mib"] / 1024,
            "under_4_gib_at_32k": long["peak_rss_mib"] < 4096,
            "time_per_token_ratio_32k_over_2k": long["us_per_token"] / short["us_per_token"],
            "time_per_token_within_2x": long["us_per_token"] <= 2 * short["us_per_token"],
        }
    return targets


def speed_table(report: dict) -> str:
    rows, lengths = report["rows"], sorted({r["length"] for r in report["rows"]})
    header = "| setup | " + " | ".join(f"L={n:,}" for n in lengths) + " |"
    lines = [header, "|---" * (len(lengths) + 1) + "|"]
    for setup, spec in SPEED_SETUPS.items():
        if not any(r["setup"] == setup for r in rows):  # (a setup added after the saved run)
            continue
        cells = []
        for length in lengths:
            row = next(r for r in rows if r["setup"] == setup and r["length"] == length)
            cells.append(row["skipped"].split(":")[0] if "skipped" in row else
                         f"{row['seconds']:.2f} s, {row['us_per_token']:.0f} µs/tok, {row['peak_rss_mib']:,.0f} MiB")
        lines.append(f"| {spec.label} | " + " | ".join(cells) + " |")
    threads = "/".join(str(t) for t in sorted({r["threads"] for r in rows if "threads" in r}))
    notes = [f"One forward pass, batch 1, fp32, no grad, {threads} torch thread(s), {report['model']}; time = the "
             "fastest of up to 5 passes (as many as fit in 30 s; 1 for the slowest cells); memory = peak RSS of the "
             "whole process (Python, torch, weights and the pass), each cell a fresh process. sinebert in its "
             "pretraining recipe's architecture (pre-LN, rotary positions; before 2026-12-07 its defaults); "
             f"ModernBERT with a GLU of the same FLOPs. {report['cpu_count']} CPU cores, load average "
             f"{report['load_average_before']} before and "
             f"{report['load_average_after']} after (above 1, other jobs shared the machine)."]
    for setup, target in report["targets"].items():
        notes.append(
            f"{SPEED_SETUPS[setup].label}: the forward pass's own memory grows "
            f"x{target['forward_mib_ratio_32k_over_8k']:.1f} from 8k to 32k tokens (x4 = linear); peak "
            f"{target['peak_gib_at_32k']:.2f} GiB at 32k; time per token at 32k is "
            f"x{target['time_per_token_ratio_32k_over_2k']:.2f} that at 2k."
        )
    for ours, theirs in (("local_global", "modernbert_local_global"), ("local", "modernbert_local")):
        ratios = [f"x{their['seconds'] / our['seconds']:.2f} at {length:,}" for length in lengths
                  if (our := _row(rows, ours, length)) and (their := _row(rows, theirs, length))]
        if ratios:
            notes.append(f"{SPEED_SETUPS[ours].label}: ModernBERT's time over sinebert's, {', '.join(ratios)}.")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {note}" for note in notes) + "\n"


def plot_speed(rows: list[dict]):
    def draw(path: Path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker

        figure, (memory, per_token) = plt.subplots(1, 2, figsize=(11, 4))
        for setup, spec in SPEED_SETUPS.items():
            done = [r for r in rows if r["setup"] == setup and "skipped" not in r]
            lengths = [r["length"] for r in done]
            style = "s--" if spec.model == "modernbert" else "o-"
            memory.plot(lengths, [r["peak_rss_mib"] / 1024 for r in done], style, label=spec.label)
            per_token.plot(lengths, [r["us_per_token"] for r in done], style, label=spec.label)
        for axis, title in ((memory, "peak memory (GiB, whole process)"), (per_token, "time per token (µs, log)")):
            axis.set_xscale("log", base=2)
            axis.set_xlabel("sequence length (tokens)")
            axis.set_title(title)
            axis.grid(alpha=0.3, which="both")
        per_token.set_yscale("log")
        per_token.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        per_token.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        memory.axhline(4, color="grey", linestyle=":", linewidth=1)
        per_token.legend(fontsize=8)
        figure.suptitle("sinebert and ModernBERT, 4 layers, hidden 256: one forward pass on CPU")
        figure.tight_layout()
        figure.savefig(path, dpi=120)
        plt.close(figure)

    return draw


# ---------------------------------------------------------------- length extrapolation


def squad_contexts(articles: range) -> list[str]:
    data = json.loads((SHARED_DATA / "squad_v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    return [p["context"] for index in articles for p in data[index]["paragraphs"]]


def write_training_text(path: Path):
    """Pretraining text from training splits only: squad_train contexts (articles 0..37), SST-2 and CoNLL train."""
    sst2 = [line.split("\t")[0] for line in (SHARED_DATA / "sst2" / "train.tsv").read_text().splitlines()[1:]]
    conll, sentence = [], []
    for line in (SHARED_DATA / "conll2003" / "train.txt").read_text().splitlines() + [""]:
        if line.strip():
            sentence.append(line.split()[0])
        elif sentence:
            conll.append(" ".join(sentence))
            sentence = []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(squad_contexts(range(0, 38)) + sst2 + conll) + "\n", encoding="utf-8")


def pretrain(work: Path, minutes: float, steps: int, threads: int | None) -> Path:
    """Tokenizer and a 128-token MLM pretraining run, through the project's own scripts. fp32: this CPU has no
    native bf16 (AVX2 only), where bf16 autocast runs ~20x slower. A constant learning rate after warmup, because the
    time limit, not the step count, ends the run. Scaled word embeddings, so that the sinusoids (entries in [-1, 1])
    do not drown the freshly initialised word embeddings (std 0.02)."""
    train_file = work / "train.txt"
    write_training_text(train_file)
    python, env = sys.executable, {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    subprocess.run([python, "scripts/train_tokenizer.py", "--train_file", str(train_file), "--vocab_size", "8192",
                    "--output_dir", str(work / "tokenizer"), "--overwrite_output_dir"], check=True, cwd=ROOT, env=env)
    sizes = [f"--{k}={v}" for k, v in EXTRAPOLATION_MODEL_SIZE.items()]
    subprocess.run([python, "scripts/pretrain.py", "--train_file", str(train_file), "--tokenizer_name",
                    str(work / "tokenizer"), "--output_dir", str(work / "pretrain"), "--overwrite_output_dir", *sizes,
                    "--norm_placement", "pre", "--scale_embeddings", "--max_seq_length", "128",
                    "--per_device_train_batch_size", "16", "--learning_rate", "2e-3",
                    "--lr_scheduler_type", "constant_with_warmup", "--num_warmup_steps", "50",
                    "--max_train_steps", str(steps), "--max_train_minutes", str(minutes), "--mixed_precision", "no",
                    "--max_eval_samples", "256", "--eval_steps", str(steps), "--logging_steps", "25"],
                   check=True, cwd=ROOT, env=env)
    return work / "pretrain"


def masked_stream(tokenizer, texts: list[str], probability: float = 0.15, seed: int = 0):
    """All evaluation text as one token stream (each paragraph followed by [SEP], as pretraining packs it) and the
    positions to mask, chosen once, so that every length and setup is scored on the same masked tokens."""
    stream = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        stream.extend(ids + [tokenizer.sep_token_id])
    stream = torch.tensor(stream)
    generator = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(len(stream), generator=generator) < probability) & (stream != tokenizer.sep_token_id)
    return stream, chosen


def masked_accuracy(model, tokenizer, stream, chosen, length: int, batch_size: int) -> dict:
    """Cut the stream into blocks of `length` tokens ([CLS] + length - 1 tokens), mask the chosen ones with [MASK],
    and score the model's top prediction at each."""
    body = length - 1
    starts = list(range(0, len(stream), body))
    correct = total = 0
    loss = 0.0
    for first in range(0, len(starts), batch_size):
        blocks = [(stream[s : s + body], chosen[s : s + body]) for s in starts[first : first + batch_size]]
        width = 1 + max(len(ids) for ids, _ in blocks)
        input_ids = torch.full((len(blocks), width), tokenizer.pad_token_id)
        attention_mask = torch.zeros_like(input_ids)
        labels = torch.full_like(input_ids, -100)
        for row, (ids, mask) in enumerate(blocks):
            input_ids[row, 0] = tokenizer.cls_token_id
            input_ids[row, 1 : 1 + len(ids)] = torch.where(mask, tokenizer.mask_token_id, ids)
            attention_mask[row, : 1 + len(ids)] = 1
            labels[row, 1 : 1 + len(ids)] = torch.where(mask, ids, -100)
        with torch.inference_mode():
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[labels != -100]
        targets = labels[labels != -100]
        correct += int((logits.argmax(-1) == targets).sum())
        loss += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        total += len(targets)
    return {"accuracy": correct / total, "loss": loss / total, "masked_tokens": total}


def extrapolation(args) -> dict:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    import sinebert  # noqa: F401  (registers the Auto classes)

    started = time.time()
    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        model_dir = pretrain(Path(args.work_dir), args.minutes, args.steps, args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stream, chosen = masked_stream(tokenizer, squad_contexts(range(38, 48)))  # squad_eval: never trained on
    rows = []
    for name, setup in EXTRAPOLATION_SETUPS.items():
        model = AutoModelForMaskedLM.from_pretrained(
            model_dir, attn_implementation=setup.attn_implementation, **setup.local
        ).eval()
        for length in args.eval_lengths:
            result = masked_accuracy(model, tokenizer, stream, chosen, length, max(1, 8192 // length))
            rows.append({"setup": name, "label": setup.label, "length": length, **result,
                         "kernels": model.attention_kernels(input_shape=(1, length))})
            print(f"{name:>13} L={length:>5}: accuracy {result['accuracy']:.4f}", flush=True)
    results_file = model_dir / "all_results.json"
    pretraining = json.loads(results_file.read_text()) if results_file.is_file() else {}
    config = json.loads((model_dir / "config.json").read_text())
    targets = stream[chosen]
    report = {"rows": rows, "model_dir": str(model_dir), "eval_tokens": len(stream),
              "most_frequent_token_accuracy": float((targets == targets.mode().values).double().mean()),
              "model_size": {k: config[k] for k in EXTRAPOLATION_MODEL_SIZE},
              "pretraining": ", ".join(f"{k}={pretraining[k]}" for k in ("train_steps", "train_tokens", "eval_accuracy")
                                      if k in pretraining) or "an unknown run",
              "minutes": round((time.time() - started) / 60, 1), "load_average_after": load_average()}
    write_report("long_context_extrapolation", report, extrapolation_table(report), plot_extrapolation(rows))
    return report


def extrapolation_table(report: dict) -> str:
    rows, lengths = report["rows"], sorted({r["length"] for r in report["rows"]})
    lines = ["| attention at evaluation | " + " | ".join(f"L={n:,}" for n in lengths) + " |",
             "|---" * (len(lengths) + 1) + "|"]
    for setup, spec in EXTRAPOLATION_SETUPS.items():
        cells = [next(r for r in rows if r["setup"] == setup and r["length"] == n) for n in lengths]
        lines.append(f"| {spec.label} | " + " | ".join(f"{c['accuracy']:.1%} (loss {c['loss']:.2f})" for c in cells)
                     + " |")
    masked = rows[0]["masked_tokens"]
    note = (f"Masked-token accuracy (top-1) on the same {masked:,} masked tokens (15% of the {report['eval_tokens']:,}-"
            "token squad_eval stream, articles 38..47, never trained on) cut into blocks of L tokens. One model "
            f"({report['model_size']}), pretrained with full attention at 128 tokens for {report['pretraining']}; the "
            "local setups load the same weights with a sliding window. Always answering the most frequent masked "
            f"token would score {report['most_frequent_token_accuracy']:.1%}.")
    return "\n".join(lines) + "\n\n- " + note + "\n"


def plot_extrapolation(rows: list[dict]):
    def draw(path: Path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(6, 4))
        for setup, spec in EXTRAPOLATION_SETUPS.items():
            done = [r for r in rows if r["setup"] == setup]
            axis.plot([r["length"] for r in done], [r["accuracy"] for r in done], "o-", label=spec.label)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("evaluation length (tokens); pretrained at 128")
        axis.set_ylabel("masked-token accuracy")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(path, dpi=120)
        plt.close(figure)

    return draw


# ---------------------------------------------------------------- output and command line


def write_report(name: str, report: dict, table: str, draw):
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(table)
    draw(RESULTS / f"{name}.png")
    print(table)


def rewrite_reports():
    for name, table, plot in (("long_context_speed", speed_table, plot_speed),
                              ("long_context_extrapolation", extrapolation_table, plot_extrapolation)):
        path = RESULTS / f"{name}.json"
        if path.is_file():
            report = json.loads(path.read_text())
            write_report(name, report, table(report), plot(report["rows"]))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("speed", "extrapolation", "all", "report", "measure"),
                        help="report: rewrite the tables and plots from the saved JSON files, measuring nothing.")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--timeout", type=int, default=600, help="Seconds allowed to one speed measurement.")
    parser.add_argument("--threads", type=int, help="torch threads per measurement (default: torch's choice).")
    parser.add_argument("--work_dir", default=str(ROOT / "runs" / "long_context"))
    parser.add_argument("--model_dir", help="Evaluate this MLM checkpoint instead of pretraining one.")
    parser.add_argument("--minutes", type=float, default=5.0, help="Pretraining time limit.")
    parser.add_argument("--steps", type=int, default=2000, help="Pretraining steps, if the time limit allows.")
    parser.add_argument("--eval_lengths", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--setup", choices=tuple(SPEED_SETUPS), help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


def main():
    args = parse_args()
    if args.part == "measure":
        print(json.dumps(measure(args.setup, args.length, args.threads)))
        return
    if args.part == "report":
        rewrite_reports()
        return
    if not SHARED_DATA.is_dir() and args.part in ("extrapolation", "all"):
        sys.exit(f"{SHARED_DATA} (the shared data) is missing; the extrapolation benchmark reads its text there.")
    if args.part in ("speed", "all"):
        speed(args)
    if args.part in ("extrapolation", "all"):
        extrapolation(args)


if __name__ == "__main__":
    main()
