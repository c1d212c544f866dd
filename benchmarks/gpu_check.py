"""The GPU check in one command: is every fast path right on this device, and how fast is sinebert here.

    python -m benchmarks.gpu_check --output_dir runs/gpu_check    # on one H200: under a minute (42 s on 2026-12-04)
    python -m benchmarks.gpu_check --device cpu --quick           # the same path in seconds, tiny sizes (the suite)
    python -m benchmarks.gpu_check --device cpu --host_only       # the host's share alone, printed: 3 minutes here

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
- one forward pass of 32,768 tokens with a sliding window of 128 and a global [CLS], bf16;
- the host's share at the cram's size (hidden 256, 4 layers), where a GPU waits on the host: per training step and
  per 4 inference batches, the wall time, the device's busy time (the profiler's kernel time), the operations that
  are not views (about one kernel launch each) and the reads of values back to the host, each a wait for the device;
  sinebert also with fp32's length buckets held to one (an A/B). On a CPU (--device cpu) the wall times and counts
  stand in for a GPU's host: the arithmetic of the quick sizes is a small part of each call.
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
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, ModernBertConfig
from transformers import ModernBertForMaskedLM, ModernBertForSequenceClassification

import sinebert
from sinebert import SineBertConfig, SineBertForMaskedLM, SineBertForSequenceClassification, SineBertModel
from sinebert import layout_sinebert

ROOT = Path(__file__).resolve().parents[1]
PEAK_BF16_FLOPS = 989e12  # H100 / H200 dense bf16
MASKING = 0.15
# sinebert's pretraining settings (configs/cram/pretrain.yaml, which a test holds this to), with the masked-only head.
# (The run of 2026-12-04 on an H200 had no rotary positions: sinusoids added, as before.)
RECIPE = dict(norm_placement="pre", scale_embeddings=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
              attention_init="normal", position_embedding_type="rotary", sparse_prediction=True)
# host: the dimensions of the host-overhead part (the cram's model), and its batch of full blocks
FULL = dict(dims=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
            vocab=30522, lengths=(128, 512), tokens_per_step=32768, steps=10, long_tokens=32768,
            host=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
            host_batch=(32, 128), inference_rows=None)
QUICK = dict(dims=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256),
             vocab=1000, lengths=(32,), tokens_per_step=512, steps=2, long_tokens=2048,
             host=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
             host_batch=(4, 32), inference_rows=64)
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
    seq = {"sliding_window": 400, "sliding_window_band": 200}.get(case, 48)  # (the band runs SDPA up to 384)
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


WINDOW = dict(sliding_window=16, global_attn_every_n_layers=2, global_attention_positions=[0])
CASES = {  # name: (model class, config overrides)
    "masked_lm": (SineBertForMaskedLM, dict(sparse_prediction=True)),  # padded, the rows read, masked-only head
    "classifier": (SineBertForSequenceClassification, dict(num_labels=3)),  # cls pooling: the first rows read
    "sliding_window": (SineBertModel, WINDOW),  # long inputs (check_batch): the blocked kernel
    "sliding_window_band": (SineBertModel, WINDOW),  # short ones: SDPA over the band
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
            kernels = model.attention_kernels(input_shape=tuple(batch["input_ids"].shape))
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
    kernels = models["sinebert"].attention_kernels(torch.bfloat16, (batch, seq))
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
    if size["inference_rows"]:  # --quick: the first two batches
        lengths, source = lengths[: size["inference_rows"]], f"{source}, first {size['inference_rows']} rows"
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
            "kernels": sorted(set(model.attention_kernels(torch.bfloat16, tuple(ids.shape))))}


# ----- the host's share -----


class DeviceReads(TorchDispatchMode):
    """Counts the operations that read tensor values back to the host, each a wait for the device on a GPU:
    `nonzero`, `.item()` / `int()` / `bool()`, boolean-mask indexing, and `.tolist()` (patched while active)."""

    READS = {torch.ops.aten.nonzero.default, torch.ops.aten._local_scalar_dense.default,
             torch.ops.aten.is_nonzero.default, torch.ops.aten.masked_select.default}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __enter__(self):
        self._tolist = torch.Tensor.tolist
        torch.Tensor.tolist = lambda tensor: self.reads.append("tolist") or self._tolist(tensor)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        indices = args[1] if func is torch.ops.aten.index.Tensor else ()
        if func in self.READS or any(i is not None and i.dtype == torch.bool for i in indices):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


class Operations(TorchDispatchMode):
    """Counts the operations that are not views: on a GPU about one kernel launch each, the host's work per call."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def host_share(function, device: torch.device, repeats: int) -> dict:
    """Wall milliseconds of `function` (median of `repeats` synchronised calls after 3), the device's busy
    milliseconds in one call (the profiler's kernel time; None on a CPU), and the operations (`Operations`) and the
    reads of values in one call."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        function()
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        function()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    busy = None
    if device.type == "cuda":
        with profile(activities=[ProfilerActivity.CUDA]) as trace:
            function()
            synchronize(device)
        busy = sum(event.self_device_time_total for event in trace.key_averages()) / 1000
    with DeviceReads() as counter:
        function()
    with Operations() as operations:
        function()
    return {"wall_ms": 1000 * statistics.median(seconds), "device_ms": busy, "operations": operations.count,
            "reads": len(counter.reads)}


def host_models(size: dict, task: str) -> dict:
    """sinebert (the recipe's settings for masked LM, the defaults for classification), BERT (sdpa, no dropout) and
    ModernBERT (sdpa) at `size["host"]`."""
    dims, vocab = size["host"], size["vocab"]
    torch.manual_seed(0)
    if task == "mlm":
        return {"sinebert": SineBertForMaskedLM(SineBertConfig(**dims, vocab_size=vocab, **RECIPE)),
                "bert_sdpa": BertForMaskedLM(BertConfig(**dims, vocab_size=vocab, hidden_dropout_prob=0.0,
                                                        attention_probs_dropout_prob=0.0, attn_implementation="sdpa")),
                "modernbert_sdpa": ModernBertForMaskedLM(modernbert_config(dims, vocab, "sdpa"))}
    return {"sinebert": SineBertForSequenceClassification(SineBertConfig(**dims, vocab_size=vocab, num_labels=2)),
            "bert_sdpa": BertForSequenceClassification(BertConfig(**dims, vocab_size=vocab, num_labels=2,
                                                                  attn_implementation="sdpa")),
            "modernbert_sdpa": ModernBertForSequenceClassification(modernbert_config(dims, vocab, "sdpa",
                                                                                     num_labels=2))}


def host_overhead(size: dict, device: torch.device) -> list[dict]:
    """The host's share of a training step on full blocks (fused AdamW) and of inference on 4 batches of 32 of SST-2
    dev's lengths, per model and precision; sinebert's fp32 inference again with its length buckets held to one."""
    batch, seq = size["host_batch"]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, size["vocab"], (batch, seq), generator=generator)
    chosen = torch.rand(batch, seq, generator=generator) < MASKING
    masked = {"input_ids": torch.where(chosen, 4, ids).to(device), "labels": torch.where(chosen, ids, -100).to(device)}
    padded = []  # SST-2 dev's first 4 batches of 32 (the third splits into two length buckets)
    for start in range(0, 128, 32):
        lengths = torch.tensor(sst2_dev_lengths()[0][start : start + 32])
        mask = (torch.arange(int(lengths.max())) < lengths[:, None]).long()
        ids = torch.randint(5, size["vocab"], mask.shape, generator=generator) * mask
        padded.append({"input_ids": ids.to(device), "attention_mask": mask.to(device)})
    rows = []
    for precision in ("fp32", "bf16"):
        for name, model in host_models(size, "mlm").items():
            model.to(device).train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

            def step():
                with autocast(device, precision):
                    loss = model(**masked).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            rows.append({"part": "training step", "model": name, "precision": precision,
                         **host_share(step, device, size["steps"] * 2)})
        for name, model in host_models(size, "classification").items():
            model.to(device).eval()

            def forward():
                with torch.no_grad(), autocast(device, precision):
                    for batch in padded:
                        model(**batch)

            rows.append({"part": "inference, 4 batches", "model": name, "precision": precision,
                         **host_share(forward, device, size["steps"] * 5)})
            if name == "sinebert" and precision == "fp32":
                buckets, layout_sinebert.MAX_BUCKETS = layout_sinebert.MAX_BUCKETS, 1
                try:
                    rows.append({"part": "inference, 4 batches", "model": "sinebert, one bucket",
                                 "precision": precision, **host_share(forward, device, size["steps"] * 5)})
                finally:
                    layout_sinebert.MAX_BUCKETS = buckets
    return rows


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
    lines += ["", "## The host's share at the cram's size", "", *host_table(report.get("host", []))]
    long = report["long_forward"]
    lines += ["", f"## One forward pass of {long['tokens']:,} tokens, sliding window 128, bf16", ""]
    if "error" in long:
        lines += [f"**{long['error']}**", ""]
    else:
        peak = "-" if long["peak_mib"] is None else f"{long['peak_mib']:,.0f} MiB"
        lines += [f"{long['seconds']:.2f} s, peak {peak}, finite: {long['finite']}; {', '.join(long['kernels'])}.", ""]
    return "\n".join(lines)


def host_table(rows: list[dict]) -> list[str]:
    lines = ["| part | model | precision | wall ms | device busy ms | operations | reads of values |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| - | - | - | **{row['error']}** | | | |")
            continue
        busy = "-" if row["device_ms"] is None else f"{row['device_ms']:.2f}"
        operations = row.get("operations", "-")  # (not counted before 2026-12-07)
        lines.append(f"| {row['part']} | {row['model']} | {row['precision']} | {row['wall_ms']:.2f} | {busy} "
                     f"| {operations} | {row['reads']} |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu.")
    parser.add_argument("--quick", action="store_true", help="Tiny sizes and few steps: checks the path in seconds.")
    parser.add_argument("--output_dir", default="runs/gpu_check", help="Where check.json and check.md go.")
    parser.add_argument("--host_only", action="store_true",
                        help="Only the host's share, printed, not saved. On a CPU its counts of operations and reads "
                             "are a GPU's host work (in fp32; bf16 takes the CPU's own kernels); its times are not.")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "error: --device cuda, but torch sees no GPU here; run on a GPU machine or pass --device cpu.\n")
    size = QUICK if args.quick else FULL
    if args.host_only:
        return print("\n".join(host_table(host_overhead(size, device))))
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
    host = measured(host_overhead, size, device)
    report["host"] = [host] if isinstance(host, dict) else host
    report["seconds"] = time.perf_counter() - started
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / "check.json").write_text(json.dumps(report, indent=1) + "\n")
    (output / "check.md").write_text(markdown(report))
    print(markdown(report))
    failed = [f"{row['case']} ({row['precision']})" for row in report["correctness"] if not row.get("passed")]
    errors = [row for row in [*report["training"], *report["inference"], report["long_forward"], *report["host"]]
              if "error" in row]
    if failed or errors:
        parser.exit(1, f"error: {len(failed)} fast paths differ from the eager reference or failed "
                       f"({', '.join(failed)}) and {len(errors)} measurements failed; see {output / 'check.md'}.\n")


if __name__ == "__main__":
    main()
