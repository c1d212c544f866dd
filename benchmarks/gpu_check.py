"""The GPU check in one command: is every fast path right on this device, and how fast is sinebert here.

    python -m benchmarks.gpu_check --output_dir runs/gpu_check    # on one H200: a few minutes (at most 8)
    python -m benchmarks.gpu_check --device cpu --quick           # the same path in seconds, tiny sizes (the suite)

Run from the repository root; it needs only torch, transformers and the repository's `sinebert/` (no datasets, no
network, no install), so that it runs as is on a lent GPU machine. Writes check.json and check.md to --output_dir:
- correctness in fp32 and bf16: each fast path (padded batches of every head, the rows a head reads, a sliding
  window with a global token, token dropping) against the fp32 eager reference, outputs and gradients, with the
  kernels that ran;
- the pretraining step at BERT-base size (hidden 768, 12 layers, 12 heads, FFN 3072, vocabulary 30,522) at 128 and
  512 tokens, in bf16: tokens/s, model FLOP utilisation against 989 TFLOP/s (dense bf16, H100/H200) and peak memory,
  beside Hugging Face BERT (sdpa) and ModernBERT (sdpa, and flash_attention_2 where flash_attn imports), each with
  its own training defaults (BERT's dropout 0.1; ModernBERT and sinebert's recipe without dropout);
- mixed-length inference over SST-2 dev's lengths in batches of 32, bf16 and fp32;
- one forward pass of 32,768 tokens with a sliding window of 128 and a global [CLS], bf16.
"""

import argparse
import importlib.util
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, ModernBertConfig
from transformers import ModernBertForMaskedLM, ModernBertForSequenceClassification

import sinebert
from sinebert import SineBertConfig, SineBertForMaskedLM, SineBertForSequenceClassification, SineBertModel

ROOT = Path(__file__).resolve().parents[1]
PEAK_BF16_FLOPS = 989e12  # H100 / H200 dense bf16
MASKING = 0.15
# sinebert's pretraining settings (configs/cram/pretrain.yaml), which speed.py reads from the recipe too
RECIPE = dict(norm_placement="pre", scale_embeddings=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
              sparse_prediction=True)
FULL = dict(dims=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
            vocab=30522, lengths=(128, 512), tokens_per_step=32768, steps=10, long_tokens=32768)
QUICK = dict(dims=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256),
             vocab=1000, lengths=(32,), tokens_per_step=512, steps=2, long_tokens=2048)
CHECK_DIMS = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
                  vocab_size=1000, max_position_embeddings=512)
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}  # largest error relative to the reference's largest value


def synchronize(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, precision: str):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


# ----- correctness -----


def check_batch(case: str, generator: torch.Generator, device: torch.device) -> dict:
    """A padded batch of mixed lengths (one row without padding), and the case's labels."""
    seq = 200 if case == "sliding_window" else 48
    lengths = torch.tensor([seq, seq // 3, seq - 5, 7])
    mask = (torch.arange(seq) < lengths[:, None]).long()
    ids = torch.randint(5, CHECK_DIMS["vocab_size"], mask.shape, generator=generator)
    batch = {"input_ids": ids, "attention_mask": mask}
    if case in ("masked_lm", "token_dropping"):
        chosen = (torch.rand(mask.shape, generator=generator) < MASKING) & mask.bool()
        batch["labels"] = torch.where(chosen, ids, -100)
    elif case == "classifier":
        batch["labels"] = torch.tensor([0, 1, 2, 1])
    return {key: value.to(device) for key, value in batch.items()}


CASES = {  # name: (model class, config overrides)
    "masked_lm": (SineBertForMaskedLM, dict(sparse_prediction=True)),  # padded, the rows read, masked-only head
    "classifier": (SineBertForSequenceClassification, dict(num_labels=3)),  # cls pooling: the first rows read
    "sliding_window": (SineBertModel, dict(sliding_window=16, global_attn_every_n_layers=2,
                                          global_attention_positions=[0])),
    "token_dropping": (SineBertForMaskedLM, dict(sparse_prediction=True, token_dropping_layers=[1, -1])),
}


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    value, reference = value.detach().float(), reference.detach().float()
    return float((value - reference).abs().max() / reference.abs().max().clamp(min=1e-6))


def check_case(case: str, precision: str, device: torch.device) -> dict:
    """The fast path (sdpa, under bf16 autocast for bf16) against the fp32 eager reference with the same weights."""
    cls, overrides = CASES[case]
    config = dict(CHECK_DIMS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **overrides)
    torch.manual_seed(0)
    reference = cls(SineBertConfig(**config)).to(device)
    reference.config._attn_implementation = "eager"
    fast = cls(SineBertConfig(**config)).to(device)
    fast.load_state_dict(reference.state_dict())
    batch = check_batch(case, torch.Generator().manual_seed(1), device)
    real = batch["attention_mask"].bool()
    # The bare encoder's loss: its outputs against a fixed random direction (LayerNorm makes a plain sum of squares
    # nearly constant, with gradients of rounding size).
    direction = torch.randn(config["hidden_size"], generator=torch.Generator().manual_seed(3)).to(device)
    results = []
    for model, run_precision in ((reference, "fp32"), (fast, precision)):
        model.train()  # no dropout in these configs; training mode turns token dropping on
        torch.manual_seed(2)  # the same tokens kept
        with autocast(device, run_precision):
            output = model(**batch, return_dict=False)
            kernels = model.attention_kernels()
        values = output[1] if "labels" in batch else output[0][real]
        (output[0] if "labels" in batch else (values.float() @ direction).mean()).backward()
        results.append((values, kernels))
    gradients = [relative_error(q.grad, p.grad) for p, q in zip(reference.parameters(), fast.parameters())
                 if p.grad is not None]
    output_error = relative_error(results[1][0], results[0][0])
    passed = max(output_error, *gradients) <= TOLERANCE[precision]
    return {"case": case, "precision": precision, "kernels": sorted(set(results[1][1])),
            "output_error": output_error, "gradient_error": max(gradients), "passed": passed}


# ----- speed -----


def flops_per_token(model: str, dims: dict, vocab: int, seq: int) -> float:
    """Matmul FLOPs of a training step per token (6 per parameter a token uses, plus attention): BERT runs every
    token through the decoder; ModernBERT and sinebert only the masked ones, and sinebert's last layer computes only
    their rows (keys and values still from every token). ModernBERT's GLU of width 8H/3 matches BERT's FLOPs."""
    d, layers, ffn = dims["hidden_size"], dims["num_hidden_layers"], dims["intermediate_size"]
    layer, head, attention = 4 * d * d + 2 * d * ffn, d * d + d * vocab, 4 * seq * d
    if model.startswith("bert"):
        return 6 * (layers * layer + head) + 3 * layers * attention
    if model.startswith("modernbert"):
        return 6 * (layers * layer + MASKING * head) + 3 * layers * attention
    read_only = 2 * d * d + 2 * d * ffn  # the last layer's work on the rows read only
    parameters = layers * layer - (1 - MASKING) * read_only + MASKING * head
    return 6 * parameters + 3 * (layers - 1 + MASKING) * attention


def modernbert_config(dims: dict, vocab: int, attention: str, **extra) -> ModernBertConfig:
    """ModernBERT of sinebert's dimensions: every layer global, the masked-only head, GLU width 8H/3."""
    return ModernBertConfig(
        vocab_size=vocab, hidden_size=dims["hidden_size"], num_hidden_layers=dims["num_hidden_layers"],
        num_attention_heads=dims["num_attention_heads"], intermediate_size=8 * dims["hidden_size"] // 3,
        global_attn_every_n_layers=1, sparse_prediction=True, max_position_embeddings=1024, pad_token_id=0,
        bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3, attn_implementation=attention, **extra)


def pretraining_models(dims: dict, vocab: int) -> dict:
    models = {
        "sinebert": SineBertForMaskedLM(SineBertConfig(**dims, vocab_size=vocab, max_position_embeddings=1024,
                                                       **RECIPE)),
        "bert_sdpa": BertForMaskedLM(BertConfig(**dims, vocab_size=vocab, max_position_embeddings=1024,
                                                attn_implementation="sdpa")),
        "modernbert_sdpa": ModernBertForMaskedLM(modernbert_config(dims, vocab, "sdpa")),
    }
    if importlib.util.find_spec("flash_attn") is not None:
        models["modernbert_flash_attention_2"] = ModernBertForMaskedLM(
            modernbert_config(dims, vocab, "flash_attention_2"))
    return models


def training_speed(size: dict, seq: int, device: torch.device) -> dict:
    """Median tokens/s, MFU and peak memory of interleaved bf16 training steps (fused AdamW for all)."""
    dims, vocab, batch = size["dims"], size["vocab"], max(1, size["tokens_per_step"] // seq)
    models = {name: model.to(device).train() for name, model in pretraining_models(dims, vocab).items()}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=device.type == "cuda")
                  for name, m in models.items()}
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch, seq), generator=generator)
    chosen = torch.rand(batch, seq, generator=generator) < MASKING
    inputs = {"input_ids": torch.where(chosen, 4, ids).to(device), "labels": torch.where(chosen, ids, -100).to(device)}
    times, peaks = {name: [] for name in models}, {}
    for step in range(size["steps"] + 3):  # 3 warm-up steps each
        for name, model in models.items():
            if device.type == "cuda" and step == 2:
                torch.cuda.reset_peak_memory_stats(device)
            synchronize(device)
            start = time.perf_counter()
            with autocast(device, "bf16"):
                loss = model(**inputs).loss
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            synchronize(device)
            if step >= 3:
                times[name].append(time.perf_counter() - start)
            if device.type == "cuda" and step == 2:
                peaks[name] = torch.cuda.max_memory_allocated(device) / 2**20
    rows = {}
    for name, seconds in times.items():
        tokens_per_second = batch * seq / statistics.median(seconds)
        rows[name] = {"tokens_per_second": tokens_per_second,
                      "mfu": flops_per_token(name, dims, vocab, seq) * tokens_per_second / PEAK_BF16_FLOPS,
                      "peak_mib": peaks.get(name)}
    kernels = models["sinebert"].attention_kernels(dtype=torch.bfloat16)
    return {"seq": seq, "batch": batch, "models": rows, "sinebert_kernels": sorted(set(kernels)),
            "sinebert_over_fastest_peer": rows["sinebert"]["tokens_per_second"]
            / max(row["tokens_per_second"] for name, row in rows.items() if name != "sinebert")}


def sst2_dev_lengths() -> tuple[list[int], str]:
    """SST-2 dev's lengths in words + 2 ([CLS], [SEP]) where the shared benchmark data is beside the repository,
    else 872 lengths drawn (seed 0) from a normal of its mean and spread (21.5 and 8.8, within 4 to 49)."""
    path = ROOT.parent / "shared" / "data" / "sst2" / "dev.tsv"
    if path.is_file():
        lines = path.read_text(encoding="utf-8").splitlines()[1:]
        return [len(line.split("\t")[0].split()) + 2 for line in lines], "SST-2 dev"
    generator = torch.Generator().manual_seed(0)
    drawn = (torch.randn(872, generator=generator) * 8.8 + 21.5).round().clamp(4, 49).long()
    return drawn.tolist(), "drawn like SST-2 dev"


def inference_speed(size: dict, precision: str, device: torch.device) -> dict:
    lengths, source = sst2_dev_lengths()
    dims, vocab = size["dims"], size["vocab"]
    torch.manual_seed(0)
    models = {
        "sinebert": SineBertForSequenceClassification(SineBertConfig(**dims, vocab_size=vocab, num_labels=2)),
        "bert_sdpa": BertForSequenceClassification(BertConfig(**dims, vocab_size=vocab, num_labels=2,
                                                              attn_implementation="sdpa")),
        "modernbert_sdpa": ModernBertForSequenceClassification(modernbert_config(dims, vocab, "sdpa", num_labels=2)),
    }
    generator = torch.Generator().manual_seed(1)
    batches = []
    for start in range(0, len(lengths), 32):
        chunk = torch.tensor(lengths[start : start + 32])
        mask = (torch.arange(int(chunk.max())) < chunk[:, None]).long()
        ids = torch.randint(5, vocab, mask.shape, generator=generator) * mask
        batches.append({"input_ids": ids.to(device), "attention_mask": mask.to(device)})
    rows = {}
    for name, model in models.items():
        model.to(device).eval()
        seconds = []
        for repeat in range(3):  # the first pass warms up
            synchronize(device)
            start = time.perf_counter()
            with torch.no_grad(), autocast(device, precision):
                for batch in batches:
                    model(**batch)
            synchronize(device)
            seconds.append(time.perf_counter() - start)
        rows[name] = {"tokens_per_second": sum(lengths) / min(seconds[1:])}
    return {"precision": precision, "lengths": source, "models": rows,
            "sinebert_over_fastest_peer": rows["sinebert"]["tokens_per_second"]
            / max(row["tokens_per_second"] for name, row in rows.items() if name != "sinebert")}


def long_forward(size: dict, device: torch.device) -> dict:
    config = SineBertConfig(**size["dims"], vocab_size=size["vocab"], sliding_window=128,
                            global_attention_positions=[0])
    model = SineBertModel(config).to(device).eval()
    ids = torch.randint(5, size["vocab"], (1, size["long_tokens"]), device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    with torch.no_grad(), autocast(device, "bf16"):
        hidden = model(input_ids=ids).last_hidden_state
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"tokens": size["long_tokens"], "seconds": seconds, "finite": bool(hidden.isfinite().all()),
            "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
            "kernels": sorted(set(model.attention_kernels(dtype=torch.bfloat16)))}


# ----- the report -----


def measured(function, *args, **labels) -> dict:
    """`function(*args)`, or `labels` with the error it raised."""
    try:
        return function(*args)
    except Exception as error:  # noqa: BLE001 (recorded in the report, and the run ends with status 1)
        return {**labels, "error": f"{type(error).__name__}: {error}"[:500]}


def environment(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "transformers": transformers.__version__, "sinebert": sinebert.__version__,
            "python": platform.python_version(), "device": device.type,
            "flash_attn": importlib.util.find_spec("flash_attn") is not None}
    if device.type == "cuda":
        capability = list(torch.cuda.get_device_capability(device))
        info |= {"gpu": torch.cuda.get_device_name(device), "capability": capability}
    else:
        info["cpu"] = platform.processor() or platform.machine()
    return info


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# GPU check ({'quick, ' if report['quick'] else ''}{env.get('gpu', env['device'])})", "",
             f"torch {env['torch']}, transformers {env['transformers']}, flash_attn: {env['flash_attn']}; "
             f"{report['seconds']:.0f} s in all. `{report['command']}`", "",
             "## Fast paths against the fp32 eager reference", "",
             "| case | precision | kernels | output error | gradient error | passed |", "|---|---|---|---|---|---|"]
    for row in report["correctness"]:
        if "error" in row:
            lines.append(f"| {row['case']} | {row['precision']} | - | - | - | **{row['error']}** |")
            continue
        lines.append(f"| {row['case']} | {row['precision']} | {', '.join(row['kernels'])} | {row['output_error']:.1e} "
                     f"| {row['gradient_error']:.1e} | {'yes' if row['passed'] else '**no**'} |")
    lines += ["", "## Pretraining step, bf16", "", "| tokens | model | tokens/s | MFU | peak MiB |",
              "|---|---|---|---|---|"]
    for row in report["training"]:
        if "error" in row:
            lines.append(f"| {row['seq']} | - | **{row['error']}** | | |")
            continue
        for name, cell in row["models"].items():
            peak = "-" if cell["peak_mib"] is None else f"{cell['peak_mib']:,.0f}"
            lines.append(f"| {row['seq']} x {row['batch']} | {name} | {cell['tokens_per_second']:,.0f} "
                         f"| {cell['mfu']:.1%} | {peak} |")
        lines.append(f"| | sinebert / fastest peer | {row['sinebert_over_fastest_peer']:.2f}x | | |")
    lines += ["", "## Mixed-length inference, batches of 32", "", "| precision | model | tokens/s |", "|---|---|---|"]
    for row in report["inference"]:
        if "error" in row:
            lines.append(f"| {row['precision']} | - | **{row['error']}** |")
            continue
        for name, cell in row["models"].items():
            lines.append(f"| {row['precision']} | {name} | {cell['tokens_per_second']:,.0f} |")
        lines.append(f"| | sinebert / fastest peer | {row['sinebert_over_fastest_peer']:.2f}x |")
    long = report["long_forward"]
    lines += ["", f"## One forward pass of {long['tokens']:,} tokens, sliding window 128, bf16", ""]
    if "error" in long:
        lines += [f"**{long['error']}**", ""]
    else:
        peak = "-" if long["peak_mib"] is None else f"{long['peak_mib']:,.0f} MiB"
        lines += [f"{long['seconds']:.2f} s, peak {peak}, finite: {long['finite']}; {', '.join(long['kernels'])}.", ""]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu.")
    parser.add_argument("--quick", action="store_true", help="Tiny sizes and few steps: checks the path in seconds.")
    parser.add_argument("--output_dir", default="runs/gpu_check", help="Where check.json and check.md go.")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "error: --device cuda, but torch sees no GPU here; run on a GPU machine or pass --device cpu.\n")
    size = QUICK if args.quick else FULL
    started = time.perf_counter()
    command = shlex.join(["python", "-m", "benchmarks.gpu_check", *(sys.argv[1:] if argv is None else argv)])
    report = {"quick": args.quick, "environment": environment(device), "command": command}
    # Device time is scarce: a part that fails is recorded with its error, and the others still run.
    report["correctness"] = [measured(check_case, case, precision, device, case=case, precision=precision)
                             for precision in ("fp32", "bf16") for case in CASES]
    report["training"] = [measured(training_speed, size, seq, device, seq=seq) for seq in size["lengths"]]
    report["inference"] = [measured(inference_speed, size, precision, device, precision=precision)
                           for precision in ("bf16", "fp32")]
    report["long_forward"] = measured(long_forward, size, device, tokens=size["long_tokens"])
    report["seconds"] = time.perf_counter() - started
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / "check.json").write_text(json.dumps(report, indent=1) + "\n")
    (output / "check.md").write_text(markdown(report))
    print(markdown(report))
    failed = [f"{row['case']} ({row['precision']})" for row in report["correctness"] if not row.get("passed")]
    errors = [row for row in [*report["training"], *report["inference"], report["long_forward"]] if "error" in row]
    if failed or errors:
        parser.exit(1, f"error: {len(failed)} fast paths differ from the eager reference or failed "
                       f"({', '.join(failed)}) and {len(errors)} measurements failed; see {output / 'check.md'}.\n")


if __name__ == "__main__":
    main()
