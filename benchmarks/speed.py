"""sinebert against transformers' BERT and ModernBERT of identical dimensions, side by side in one process, on the
same batches.

    python benchmarks/speed.py              # everything (about 90 minutes on 2 CPU cores)
    python benchmarks/speed.py --quick      # a few steps of each, to check the benchmark runs
    python benchmarks/speed.py --remeasure memory   # redo one part of the saved results (memory, peak, inference)
    python benchmarks/speed.py --remeasure training --cell small fp32   # redo one training row
    python benchmarks/speed.py --profile    # where an inference pass of each model spends its time (fp32, bf16)
    python benchmarks/speed.py --inference_only     # only the inference rows, printed, not saved (for A/B runs)
    python benchmarks/speed.py --inference_only --compiled  # the same with every model torch.compile'd (serving)
    python benchmarks/speed.py --compiled_training small bf16 mlm   # sinebert's training step compiled against
                                    # eager (--torch_compile), pretraining or classification fine-tuning; prints only
    python benchmarks/speed.py --name speed_h200    # results under another name (another machine's)
    python benchmarks/speed.py --kernels    # full attention alone: PyTorch's SDPA against sinebert's matmul kernel;
                                            # and the bf16 softmax and products that unpadding rounds up for

Measures (each model in its own best setting: sinebert with its pretraining settings, those of
configs/cram/pretrain.yaml (no dropout), and again with token dropping (TOKEN_DROPPING, a pretraining flag); BERT with
attn_implementation="sdpa" and its own defaults (dropout 0.1), BERT again without dropout, as sinebert pretrains, and
BERT with attn_implementation="eager", which is faster than its sdpa in bf16 on some CPUs; ModernBERT as
`modernbert_config` builds it (no dropout, as it pretrains), under "sdpa" and under "eager"; steps interleaved, so
machine noise hits all alike; each sinebert row's ratio is against the fastest of the peers in that row):
- pretraining step throughput (tokens/s) at two sizes, fp32 and bf16 autocast, batch 32 x 128, 15% masking;
  and the model FLOP/s of each as a share of this machine's matmul peak for that dtype (measured here);
- inference throughput on the SST-2 dev sentences in batches of 32 padded to the longest, as users run BERT;
- peak memory (RSS) of each in a fresh process;
- masked-token accuracy after the same steps on the same real batches, at both sizes (--curve_steps), against the
  steps and against each model's own training seconds (time to accuracy).
Writes benchmarks/results/speed.{json,md,png} (--name NAME: NAME.{json,md,png}).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
)

from sinebert import SineBertConfig, SineBertForMaskedLM, SineBertForSequenceClassification
from sinebert.training.loop import cpu_fields, cpu_has_native_bf16
from sinebert.training.reporting import peak_rss_mib

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
DATA = ROOT.parent / "shared" / "data"
SIZES = {"small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
         "base-ish": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048)}
VOCAB, BATCH, SEQ, MASKING = 16000, 32, 128, 0.15
RECIPE = ROOT / "configs" / "cram" / "pretrain.yaml"
RECIPE_SETTINGS = ("norm_placement", "scale_embeddings", "hidden_dropout_prob", "attention_probs_dropout_prob",
                   "attention_init", "position_embedding_type")
# sinebert also runs with token dropping, as `scripts/pretrain.py --token_dropping_layers 1 -1` trains: every layer
# but the first and the last computes the masked tokens and half of the others.
TOKEN_DROPPING = {"token_dropping_layers": [1, -1], "token_dropping_keep": 0.5}
# The same benchmark on a GPU machine: models, batches and autocast go to CUDA, timings synchronise it, and memory is
# the CUDA allocator's peak instead of the process's RSS.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synchronize():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def autocast(precision: str):
    return torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def peak_gflops() -> dict:
    return {p: matmul_peak(p) for p in ("fp32", "bf16")}


def matmul_peak(precision: str, repeats: int = 10) -> float:
    """Best GFLOP/s of an n x n matrix product on the path training takes: `F.linear` on fp32 tensors, under bf16
    autocast for "bf16"; n = 2048 on a CPU, 8192 on a GPU (where 2048 is too small to fill the chip). (A plain bf16
    matmul is not that path: on a CPU without bf16 instructions it runs ~20x slower than autocast's linear, and made
    the model look faster than the peak.)"""
    n = 8192 if DEVICE.type == "cuda" else 2048
    a, b = torch.randn(n, n, device=DEVICE), torch.randn(n, n, device=DEVICE)

    def product():
        with autocast(precision):
            return torch.nn.functional.linear(a, b)

    for _ in range(3):
        product()
    best = float("inf")
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        product()
        synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def recipe_architecture() -> dict:
    """sinebert's settings from the cram recipe (pre-LN, scaled embeddings, no dropout, rotary positions): the
    architecture a checkpoint pretrained by it, and every model fine-tuned from one, has."""
    import yaml

    recipe = yaml.safe_load(RECIPE.read_text())
    return {key: recipe[key] for key in RECIPE_SETTINGS}


def pretraining_settings() -> dict:
    """`recipe_architecture` with the masked-LM head predicting only the masked tokens, as `scripts/pretrain.py` sets
    it."""
    return recipe_architecture() | {"sparse_prediction": True}


def dims_of(size: str) -> dict:
    return dict(SIZES[size], vocab_size=VOCAB, max_position_embeddings=512, type_vocab_size=2)


def sinebert_config(size: str, token_dropping: bool = False) -> SineBertConfig:
    """sinebert's masked-LM config at `size`: its pretraining settings, with TOKEN_DROPPING if asked."""
    return SineBertConfig(**dims_of(size), **pretraining_settings(), **(TOKEN_DROPPING if token_dropping else {}))


def models(size: str, task: str = "mlm", bert_dropout: float | None = None, bert_attention: str = "sdpa",
           token_dropping: bool = False, pooling: str = "mean"):
    """(sinebert, BERT) of identical dimensions. For MLM sinebert takes its pretraining settings (and token
    dropping if asked) and BERT its own defaults (dropout 0.1), or `bert_dropout`; for classification (inference
    only) sinebert keeps the architecture it was pretrained with, as a checkpoint fine-tuned from it does (pre-LN,
    rotary positions), and reads the mean of its token vectors (`pooling`), as `scripts/pretrain.py` writes into its
    checkpoints' config; BERT takes its defaults. BERT's attention runs `bert_attention`."""
    dims = dims_of(size)
    torch.manual_seed(0)
    if task == "mlm":
        ours = SineBertForMaskedLM(sinebert_config(size, token_dropping))
        dropout = {} if bert_dropout is None else {"hidden_dropout_prob": bert_dropout,
                                                   "attention_probs_dropout_prob": bert_dropout}
        theirs = BertForMaskedLM(BertConfig(**dims, **dropout, attn_implementation=bert_attention))
    else:
        ours = sinebert_classifier(size, pooling)
        theirs = BertForSequenceClassification(BertConfig(**dims, num_labels=2, attn_implementation=bert_attention))
    return ours.to(DEVICE), theirs.to(DEVICE)


def sinebert_classifier(size: str, pooling: str = "mean") -> SineBertForSequenceClassification:
    """sinebert's classifier at `size` in the architecture it was pretrained with (pre-LN, rotary positions), reading
    its token vectors by `pooling`, two labels."""
    return SineBertForSequenceClassification(
        SineBertConfig(**dims_of(size), **recipe_architecture(), classifier_pooling=pooling, num_labels=2)
    )


def modernbert_config(size: str | dict, attention: str = "sdpa", vocab_size: int = VOCAB, **extra) -> ModernBertConfig:
    """transformers' ModernBERT at `size` (a name of SIZES, or such dimensions): every layer global (at 128 tokens its
    128-token local window would see every token anyway), the masked-only head (`sparse_prediction`, as sinebert's),
    and a GLU width of 2/3 of BERT's intermediate size, so that its feed-forward FLOPs equal BERT's; no dropout (its
    default and its recipe). `extra` adds to or overrides these settings."""
    dims = SIZES[size] if isinstance(size, str) else size
    settings = dict(
        vocab_size=vocab_size, hidden_size=dims["hidden_size"], num_hidden_layers=dims["num_hidden_layers"],
        num_attention_heads=dims["num_attention_heads"], intermediate_size=round(2 * dims["intermediate_size"] / 3),
        max_position_embeddings=512, layer_types=["full_attention"] * dims["num_hidden_layers"],
        sparse_prediction=True, pad_token_id=0, cls_token_id=2, bos_token_id=2, sep_token_id=3, eos_token_id=3,
        attn_implementation=attention,
    )
    return ModernBertConfig(**(settings | extra))


def modernbert(size: str, task: str = "mlm", attention: str = "sdpa"):
    torch.manual_seed(0)
    if task == "mlm":
        return ModernBertForMaskedLM(modernbert_config(size, attention)).to(DEVICE)
    return ModernBertForSequenceClassification(modernbert_config(size, attention, num_labels=2)).to(DEVICE)


PEERS = ("bert", "bert_no_dropout", "bert_eager", "modernbert", "modernbert_eager")


def against_fastest_peer(result: dict, names: tuple[str, ...]):
    """Adds, for each of `names`, its tokens/s over the fastest peer's in `result`, and which peer that was."""
    peers = [peer for peer in PEERS if f"{peer}_tokens_per_second" in result]
    fastest = max(peers, key=lambda peer: result[f"{peer}_tokens_per_second"])
    result["fastest_peer"] = fastest
    for name in names:
        result[f"{name}_vs_fastest_peer"] = result[f"{name}_tokens_per_second"] / result[f"{fastest}_tokens_per_second"]


def masked_batch(generator: torch.Generator, rows: int = BATCH, vocab: int = VOCAB) -> dict:
    ids = torch.randint(5, vocab, (rows, SEQ), generator=generator)
    chosen = torch.rand(rows, SEQ, generator=generator) < MASKING
    return {"input_ids": torch.where(chosen, 4, ids).to(DEVICE), "labels": torch.where(chosen, ids, -100).to(DEVICE)}


def training_flops_per_token(size: str, model: str) -> float:
    """Matmul FLOPs of one training step per token: 6 x parameters used per token (forward 2, backward 4), plus
    attention scores and mixing. BERT runs every token through every layer and the decoder. sinebert runs only the
    masked ones through the decoder and, in the last layer, through the query projection, attention, output
    projection and feed-forward network (keys and values still come from every token); with token dropping
    ("sinebert_dropping") its dropping layers compute a share of the tokens, attending among those alone."""
    d, layers, ffn = SIZES[size]["hidden_size"], SIZES[size]["num_hidden_layers"], SIZES[size]["intermediate_size"]
    layer = 4 * d * d + 2 * d * ffn
    head = d * d + d * VOCAB
    attention = 2 * 2 * SEQ * d  # QK^T and AV per query per layer, over every key
    if model == "bert":
        return 6 * (layers * layer + head) + 3 * layers * attention
    if model == "modernbert":  # every token through every layer (GLU FLOPs as BERT's), the head on the masked ones
        return 6 * (layers * layer + MASKING * head) + 3 * layers * attention
    dropping, keep = range(0), 1.0
    if model == "sinebert_dropping":
        config = sinebert_config(size, token_dropping=True)
        dropping, keep = config.token_dropping_range, config.token_dropping_keep
    read_only = 2 * d * d + 2 * d * ffn  # the last layer's parameters that see only the rows the head reads
    full = layers - 1 - len(dropping)
    parameters = full * layer + len(dropping) * keep * layer + layer - (1 - MASKING) * read_only + MASKING * head
    return 6 * parameters + 3 * (full + len(dropping) * keep * keep + MASKING) * attention


def train_throughput(size: str, precision: str, steps: int, warmup: int = 2) -> dict:
    """Median tokens/s of interleaved training steps (after `warmup` steps each) of sinebert (and with token
    dropping) and of every peer (PEERS). All use the fused AdamW step that sinebert's Trainer uses: the optimizer is
    not what is compared."""
    ours, theirs = models(size)
    contenders = {"sinebert": ours, "sinebert_dropping": models(size, token_dropping=True)[0], "bert": theirs,
                  "bert_no_dropout": models(size, bert_dropout=0.0)[1],
                  "bert_eager": models(size, bert_attention="eager")[1],
                  "modernbert": modernbert(size), "modernbert_eager": modernbert(size, attention="eager")}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for name, m in contenders.items()}
    generator = torch.Generator().manual_seed(0)
    batches = [masked_batch(generator) for _ in range(4)]
    times = {name: [] for name in contenders}
    for step in range(steps + warmup):
        for name, model in contenders.items():
            seconds = seconds_of(lambda: train_step(model, optimizers[name], batches[step % len(batches)], precision))
            if step >= warmup:
                times[name].append(seconds)
    result = {"size": size, "precision": precision}
    for name in times:
        seconds = statistics.median(times[name])
        result[f"{name}_tokens_per_second"] = BATCH * SEQ / seconds
        flops = training_flops_per_token(size, name.split("_")[0] if name in PEERS else name) * BATCH * SEQ / seconds
        result[f"{name}_gflops"] = flops / 1e9
    against_fastest_peer(result, ("sinebert", "sinebert_dropping"))
    return result


def compiled_training(size: str, precision: str, steps: int, warmup: int = 8, task: str = "mlm") -> dict:
    """Seconds a training step of sinebert under `torch.compile` (as the scripts' --torch_compile runs it) and eager,
    same weights: `warmup` compiled steps, then `steps` of each interleaved, twice over the same batches, gradients
    clipped at 1.0. `task` "mlm": the pretraining model on batches of new masked counts; "classification": the
    classifier a fine-tuning run makes, on SST-2 dev's padded batches of 32 (new lengths each)."""
    def model_and_optimizer():
        torch.manual_seed(0)
        model = (SineBertForMaskedLM(sinebert_config(size)) if task == "mlm" else sinebert_classifier(size)).to(DEVICE)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    (eager, eager_optimizer), (compiled, compiled_optimizer) = model_and_optimizer(), model_and_optimizer()
    compiled = torch.compile(compiled)
    generator = torch.Generator().manual_seed(0)
    if task == "mlm":
        batches = [masked_batch(generator) for _ in range(warmup + steps)]
    else:
        batches = [dict(batch, labels=torch.randint(2, (len(batch["input_ids"]),), generator=generator).to(DEVICE))
                   for batch in inference_batches(sst2_dev())[: warmup + steps]]
    result = {"compile_seconds": seconds_of(lambda: [train_step(compiled, compiled_optimizer, batch, precision, 1.0)
                                                     for batch in batches[:warmup]])}
    for batch in batches[:2]:
        train_step(eager, eager_optimizer, batch, precision, 1.0)
    times = {"eager": [], "compiled": []}
    for batch in batches[warmup:] * 2:
        for name, model, optimizer in (("eager", eager, eager_optimizer), ("compiled", compiled, compiled_optimizer)):
            times[name].append(seconds_of(lambda: train_step(model, optimizer, batch, precision, 1.0)))
    return result | {f"{name}_seconds": statistics.median(times[name]) for name in times}


def sst2_dev() -> list[str]:
    lines = (DATA / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines]


def inference_batches(sentences: list[str], batch_size: int = 32):
    """Batches of `batch_size` in file order, padded to the longest of each, as a user's loop does (1: one sentence
    at a time, as `pipeline(...)` serves by default)."""
    from sinebert.training.tokenizer import train_wordpiece

    tokenizer = train_wordpiece(sentences, vocab_size=2000, min_frequency=1)
    return [tokenizer(sentences[i : i + batch_size], padding=True, return_tensors="pt").to(DEVICE)
            for i in range(0, len(sentences), batch_size)]


def seconds_of(function) -> float:
    """Seconds of one call of `function`, the device synchronised around it."""
    synchronize()
    start = time.perf_counter()
    function()
    synchronize()
    return time.perf_counter() - start


def best_seconds(function, repeats: int) -> float:
    """Best of `repeats` timed calls of `function`, after one untimed."""
    function()
    return min(seconds_of(function) for _ in range(repeats))


def timed_pass(model, batches: list) -> float:
    """Seconds of one pass of `model` over `batches`."""
    return seconds_of(lambda: [model(**batch) for batch in batches])


# Batches per timed piece of an inference pass: about a tenth of a second of a model's work, one sentence at a time.
PASS_PIECE = 32


def inference_throughput(precision: str, batches: list, repeats: int, compiled: bool = False,
                         pooling: str = "mean") -> dict:
    """Tokens/s of each model over `batches` (median of `repeats` passes after one untimed). `precision`: "fp32",
    "bf16" (autocast over float32 weights) or "bf16 weights" (every model's weights cast to bf16, as
    `from_pretrained(..., dtype=torch.bfloat16)` serves, no autocast). `compiled`: every model through
    `torch.compile(dynamic=True)` with inductor's freezing (weights folded in as constants, for serving), and the
    seconds of each one's first, compiling pass. `pooling`: sinebert's classifier_pooling."""
    ours, theirs = (m.eval() for m in models("small", task="classification", pooling=pooling))
    contenders = {"sinebert": ours, "bert": theirs,
                  "bert_eager": models("small", task="classification", bert_attention="eager")[1].eval(),
                  "modernbert": modernbert("small", "classification").eval(),
                  "modernbert_eager": modernbert("small", "classification", "eager").eval()}
    if precision == "bf16 weights":
        contenders = {name: model.to(torch.bfloat16) for name, model in contenders.items()}
    # ModernBERT takes no token_type_ids.
    inputs = {name: [{k: v for k, v in b.items() if k != "token_type_ids"} for b in batches]
              if name.startswith("modernbert") else batches for name in contenders}
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["attention_mask"].numel() for b in batches)
    result = {"precision": precision, "real_tokens": tokens, "padded_tokens": padded, "compiled": compiled,
              "pooling": pooling, "batch_size": len(batches[0]["input_ids"])}
    times = {name: [] for name in contenders}
    freezing = nullcontext()
    if compiled:
        from torch._inductor import config as inductor  # only here: importing inductor takes a second

        freezing = inductor.patch(freezing=True)
    with torch.no_grad(), autocast(precision), freezing:
        if compiled:
            # The models share code objects (transformers' output wrapper): without a reset, the second precision's
            # graphs would pass dynamo's limit of 8 per code object and run eager.
            torch._dynamo.reset()
            contenders = {name: torch.compile(model, dynamic=True) for name, model in contenders.items()}
            result["compile_seconds"] = {name: timed_pass(model, inputs[name]) for name, model in contenders.items()}
        # Each pass is timed in pieces, the models taking turns piece by piece, so that the host's drift within a
        # pass (a pass of one sentence at a time takes seconds) falls on every model alike.
        pieces = [slice(start, start + PASS_PIECE) for start in range(0, len(batches), PASS_PIECE)]
        for repeat in range(repeats + 1):
            seconds = dict.fromkeys(contenders, 0.0)
            for piece in pieces:
                for name, model in contenders.items():
                    seconds[name] += timed_pass(model, inputs[name][piece])
            if repeat:
                for name in times:
                    times[name].append(seconds[name])
    for name in times:
        result[f"{name}_tokens_per_second"] = tokens / statistics.median(times[name])
    against_fastest_peer(result, ("sinebert",))
    return result


def profile_inference(batches: list, rows: int = 12):
    """Prints the operators that take most of one pass over `batches`, for each model, in fp32 and under bf16
    autocast."""
    from torch.profiler import profile

    contenders = dict(zip(("sinebert", "bert"), (m.eval() for m in models("small", task="classification"))))
    for precision in ("fp32", "bf16"):
        with torch.no_grad(), autocast(precision):
            for name, model in contenders.items():
                for batch in batches:  # warm-up
                    model(**batch)
                with profile() as trace:
                    for batch in batches:
                        model(**batch)
                table = trace.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
                print(f"{name}, {precision}:\n{table}")


KERNEL_SHAPES = ((32, 4, 128, 64), (32, 8, 128, 64), (8, 4, 512, 64), (2, 4, 2048, 64))


def full_attention_alone() -> dict:
    """PyTorch's scaled_dot_product_attention and sinebert's `matmul_attention_forward`, each `(q, k, v) -> output`
    without a mask, for timing the kernels alone."""
    from sinebert.attention_sinebert import matmul_attention_forward

    module = torch.nn.Module()
    return {"sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v),
            "matmul": lambda q, k, v: matmul_attention_forward(module, q, k, v, None, q.shape[-1] ** -0.5)[0]}


def kernel_times(repeats: int = 5) -> list[str]:
    """Forward and backward milliseconds (best of `repeats`) of full attention without a mask, (batch, heads, seq,
    head_dim) as in KERNEL_SHAPES, through PyTorch's scaled_dot_product_attention and through sinebert's
    `matmul_attention_forward`, in fp32 and bf16: the measurement behind `full_attention_kernel`'s "matmul"."""
    kernels = full_attention_alone()
    lines = ["| (batch, heads, seq, head_dim) | dtype | SDPA forward + backward ms | matmul forward + backward ms |",
             "|---|---|---|---|"]
    for shape in KERNEL_SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            cells = []
            for kernel in kernels.values():
                q, k, v = (torch.randn(shape, dtype=dtype, device=DEVICE, requires_grad=True) for _ in range(3))
                forward, backward = [], []
                for _ in range(repeats + 1):
                    synchronize()
                    start = time.perf_counter()
                    output = kernel(q, k, v)
                    synchronize()
                    middle = time.perf_counter()
                    output.sum().backward()
                    synchronize()
                    forward.append(middle - start)
                    backward.append(time.perf_counter() - middle)
                cells.append(f"{1000 * min(forward[1:]):.1f} + {1000 * min(backward[1:]):.1f}")
            lines.append(f"| {shape} | {str(dtype).removeprefix('torch.')} | {cells[0]} | {cells[1]} |")
    return lines


def alternating_medians(calls: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each of `calls` (name -> function), timed `repeats` times in turn, so that the host's drift
    falls on all of them alike."""
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            times[name].append(seconds_of(call))
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def small_kernel_times(repeats: int = 200) -> list[str]:
    """Median microseconds of small full-attention calls in bf16 (4 heads of 64, no mask), SDPA against the matmul
    kernel, alternating: served (forward, no gradient) and trained (forward and backward). The measurement behind
    MATMUL_ATTENTION_MIN_SCORES, below which serving keeps SDPA."""
    kernels = full_attention_alone()
    lines = ["| (batch, seq) | scores | served: SDPA / matmul us | trained: SDPA / matmul us |", "|---|---|---|---|"]
    for batch, seq in ((1, 16), (1, 24), (1, 64), (1, 96), (2, 64), (4, 32), (8, 32), (16, 16)):
        cells = []
        for grad in (False, True):
            q, k, v = (torch.randn(batch, 4, seq, 64, dtype=torch.bfloat16, device=DEVICE, requires_grad=grad)
                       for _ in range(3))
            calls = {name: lambda kernel=kernel: kernel(q, k, v).sum().backward() if grad else kernel(q, k, v)
                     for name, kernel in kernels.items()}
            with torch.set_grad_enabled(grad):
                medians = alternating_medians(calls, repeats)
            cells.append(" / ".join(f"{1e6 * medians[name]:.0f}" for name in kernels))
        lines.append(f"| ({batch}, {seq}) | {batch * 4 * seq * seq:,} | {cells[0]} | {cells[1]} |")
    return lines


def served_kernel_times(repeats: int = 20) -> list[str]:
    """Median microseconds of served full-attention calls in bf16 (no gradient; 4 heads of 64; keys masked past
    lengths drawn from half the keys to all of them, as the length buckets' additive mask), SDPA against the matmul
    kernel, alternating: the shapes of SST-2 dev's buckets, then longer inputs. The measurement behind
    CPU_HAS_AMX's part in `full_attention_kernel`."""
    from sinebert.attention_sinebert import additive_mask, matmul_attention_forward

    module = torch.nn.Module().eval()
    generator = torch.Generator().manual_seed(0)
    lines = ["| (batch, queries, keys) | scores | SDPA us | matmul us | matmul / SDPA |", "|---|---|---|---|---|"]
    for batch, queries, keys in ((16, 28, 32), (16, 57, 64), (8, 66, 96), (32, 120, 128), (8, 380, 384),
                                 (2, 2000, 2048)):
        q = torch.randn(batch, 4, queries, 64, generator=generator).bfloat16().to(DEVICE)
        k, v = (torch.randn(batch, 4, keys, 64, generator=generator).bfloat16().to(DEVICE) for _ in range(2))
        lengths = torch.randint(keys // 2, keys + 1, (batch,), generator=generator)
        mask = additive_mask((torch.arange(keys) < lengths[:, None])[:, None, None, :].to(DEVICE), torch.bfloat16)
        calls = {"sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                 "matmul": lambda: matmul_attention_forward(module, q, k, v, mask, 0.125, every_query_has_a_key=True)}
        with torch.no_grad():
            medians = alternating_medians(calls, repeats)
        sdpa, matmul = (1e6 * medians[name] for name in calls)
        lines.append(f"| ({batch}, {queries}, {keys}) | {batch * 4 * queries * keys:,} | {sdpa:,.0f} | {matmul:,.0f} | "
                     f"x{matmul / sdpa:.2f} |")
    return lines


def rounding_times(repeats: int = 20) -> list[str]:
    """What bf16 unpadded batches round up, and why: the softmax over a bucket's keys, with the keys as they are
    and rounded up to a multiple of 32 (`MATMUL_KEY_MULTIPLE`), and the feed-forward network's first product over
    28 row counts such as unpadded batches have, as they are and rounded up to a multiple of 16
    (`CPU_BF16_ROW_MULTIPLE`; GFLOP/s of the real rows)."""
    lines = ["| bf16 softmax of (11, 4, 40, keys) scores | ms |", "|---|---|"]
    for keys in (40, 64, 63, 64 + 32, 100, 128):
        scores = torch.randn(11, 4, 40, keys, device=DEVICE).bfloat16()
        lines.append(f"| {keys} keys | {1000 * best_seconds(lambda: scores.softmax(-1), repeats):.3f} |")
    weight, bias = torch.randn(1024, 256, device=DEVICE).bfloat16(), torch.randn(1024, device=DEVICE).bfloat16()
    counts = [950 + 7 * i for i in range(28)]
    lines += ["", "| bf16 (rows, 256) x (256, 1024) over rows 950, 957, ..., 1139 | GFLOP/s of the real rows |",
              "|---|---|"]
    for multiple in (1, 16):
        inputs = [torch.randn(-(-n // multiple) * multiple, 256, device=DEVICE).bfloat16() for n in counts]
        seconds = best_seconds(lambda: [torch.nn.functional.linear(x, weight, bias) for x in inputs], repeats // 4)
        label = "as they are" if multiple == 1 else f"rounded up to a multiple of {multiple}"
        lines.append(f"| {label} | {2 * sum(counts) * 256 * 1024 / seconds / 1e9:.0f} |")
    return lines


def training_peak(model_name: str, size: str, precision: str, steps: int) -> float:
    """Peak memory (MiB) of `steps` training steps of one model: the process's peak RSS on a CPU (run it in a fresh
    process), the CUDA allocator's peak since the model was built on a GPU."""
    model = modernbert(size) if model_name == "modernbert" else dict(zip(("sinebert", "bert"), models(size)))[model_name]
    if DEVICE.type == "cuda":  # the other model of `models` is freed by now
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        train_step(model, optimizer, masked_batch(generator), precision)
    if DEVICE.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return peak_rss_mib()


def peak_memory(model_name: str, size: str, precision: str, steps: int = 3) -> float:
    """`training_peak` in a fresh process, so that one model's allocations do not count for the other; on a GPU in
    this one, from a reset of the allocator's peak with no other model held (on a lent H200, 12 fresh processes, each
    starting CUDA, had not finished in the 3 minutes left of the run's 5)."""
    if DEVICE.type == "cuda":
        return training_peak(model_name, size, precision, steps)
    call = f"training_peak({model_name!r}, {size!r}, {precision!r}, {steps})"
    code = f"from benchmarks.speed import training_peak; print({call})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return float(result.stdout.strip().splitlines()[-1])


PRETRAINING_MODELS = ("bert", "modernbert", "sinebert", "sinebert_dropping")
MEMORY_MODELS = ("bert", "modernbert", "sinebert")


def accuracy_curves(steps: int, precision: str) -> dict:
    """Masked-token accuracy of each of PRETRAINING_MODELS every 25 steps at each size, trained on the same real batches
    under `precision`, with the seconds each model's own training steps took until then (time to accuracy)."""
    from sinebert.training.mlm import MaskingCollator, pack_texts
    from sinebert.training.tokenizer import train_wordpiece

    lines = [row.split("\t")[0] for row in (DATA / "sst2" / "train.tsv").read_text().splitlines()[1:]]
    tokenizer = train_wordpiece(lines, vocab_size=VOCAB)
    blocks = pack_texts(lines, tokenizer, SEQ)
    collator = MaskingCollator(tokenizer, MASKING, seed=0)

    def batch_of(rows, first: int) -> dict:
        """The masked batch of `rows`, numbered from `first` (each example keeps its own mask), on DEVICE."""
        masked = collator([{"input_ids": b, "example_id": first + i} for i, b in enumerate(rows)])
        return {key: value.to(DEVICE) for key, value in masked.items()}

    held_out = batch_of(blocks[:128], 0)
    train = blocks[128:]
    curves = {"precision": precision}
    for size in SIZES:
        print(f"  {size} ...", flush=True)
        ours, theirs = models(size)
        contenders = dict(zip(PRETRAINING_MODELS, (theirs, modernbert(size), ours, models(size, token_dropping=True)[0])))
        optimizers = {name: torch.optim.AdamW(m.parameters(), lr=5e-4, fused=True) for name, m in contenders.items()}
        curve = curves[size] = {"step": []} | {name: [] for name in contenders}
        clock = {name: 0.0 for name in contenders}
        curve["seconds"] = {name: [] for name in contenders}
        for step in range(steps + 1):
            if step % 25 == 0:
                curve["step"].append(step)
                for name, model in contenders.items():
                    curve[name].append(masked_accuracy(model, held_out, precision))
                    curve["seconds"][name].append(clock[name])
            if step == steps:
                break
            start = (step * BATCH) % (len(train) - BATCH)
            batch = batch_of(train[start : start + BATCH], start)
            for name, model in contenders.items():
                model.train()
                clock[name] += seconds_of(lambda: train_step(model, optimizers[name], batch, precision))
    return curves


def train_step(model, optimizer, batch: dict, precision: str, max_grad_norm: float | None = None):
    """One optimizer step of `model` on `batch` under `precision`, the gradient norm clipped if `max_grad_norm`."""
    with autocast(precision):
        loss = model(**batch).loss
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def accuracy_at(curve: dict, name: str, seconds: float) -> float | None:
    """`name`'s held-out accuracy after `seconds` of its own training, interpolated linearly between evaluations;
    None past its last evaluation."""
    points = list(zip(curve["seconds"][name], curve[name]))
    for (t0, a0), (t1, a1) in zip(points, points[1:]):
        if t0 <= seconds <= t1:
            return a0 + (a1 - a0) * (seconds - t0) / max(t1 - t0, 1e-9)
    return None


def masked_accuracy(model, batch, precision: str) -> float:
    model.eval()
    with torch.no_grad(), autocast(precision):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    chosen = batch["labels"] != -100
    return float((logits[chosen].argmax(-1) == batch["labels"][chosen]).float().mean())


LABELS = {"bert": "HF BERT (sdpa)", "modernbert": "ModernBERT (sdpa)", "sinebert": "sinebert",
          "sinebert_dropping": "sinebert, token dropping"}


def plot(report: dict, path: Path):
    """speed.png: pretraining tokens/s per row, and per size held-out accuracy against each model's training
    seconds (time to accuracy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {size: curve for size, curve in report.get("curves", {}).items() if size in SIZES}
    figure, axes = plt.subplots(1, 1 + len(curves), figsize=(5.5 * (1 + len(curves)), 4), squeeze=False)
    axes = axes[0]
    rows = report["training"]
    x, width = range(len(rows)), 0.8 / len(PRETRAINING_MODELS)
    for i, name in enumerate(PRETRAINING_MODELS):
        offset = (i - (len(PRETRAINING_MODELS) - 1) / 2) * width
        axes[0].bar([j + offset for j in x], [r[f"{name}_tokens_per_second"] for r in rows], width, label=LABELS[name])
    axes[0].set_xticks(list(x), [f"{r['size']}\n{r['precision']}" for r in rows])
    axes[0].set_ylabel("training tokens/s")
    axes[0].set_title("pretraining step, batch 32 x 128")
    axes[0].legend()
    for axis, (size, curve) in zip(axes[1:], curves.items()):
        for name, style in zip(PRETRAINING_MODELS, ("o-", "d-", "s-", "^-")):
            axis.plot(curve["seconds"][name], [100 * a for a in curve[name]], style, label=LABELS[name])
        axis.set_title(f"{size}, {report['curves']['precision']}, the same batches")
        axis.set_xlabel("training seconds")
        axis.set_ylabel("held-out masked-token accuracy (%)")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def curves_table(curves: dict) -> list[str]:
    names = PRETRAINING_MODELS
    lines = [f"| held-out masked-token accuracy, % ({curves['precision']}; training seconds) | step | "
             + " | ".join(LABELS[name] for name in names) + " |", "|---|---|" + "---|" * len(names)]
    for size in (size for size in SIZES if size in curves):
        curve = curves[size]
        for i, step in enumerate(curve["step"]):
            cells = " | ".join(f"{100 * curve[name][i]:.1f} ({curve['seconds'][name][i]:.0f} s)" for name in names)
            lines.append(f"| {size if i == 0 else ''} | {step} | {cells} |")
    return lines


def equal_time_table(curves: dict) -> list[str]:
    """Per size: every model's held-out accuracy after as many seconds of its own training as sinebert's whole
    curve took (time to accuracy at an equal budget)."""
    lines = ["| held-out accuracy % after sinebert's training time | seconds | " + " | ".join(
             LABELS[name] for name in PRETRAINING_MODELS) + " |", "|---|---|" + "---|" * len(PRETRAINING_MODELS)]
    for size in (size for size in SIZES if size in curves):
        curve = curves[size]
        budget = curve["seconds"]["sinebert"][-1]
        reached = [accuracy_at(curve, name, budget) for name in PRETRAINING_MODELS]
        cells = " | ".join("-" if a is None else f"{100 * a:.1f}" for a in reached)
        lines.append(f"| {size} | {budget:.0f} | {cells} |")
    return lines


def tokens(result: dict, name: str) -> str:
    return f"{result[f'{name}_tokens_per_second']:,.0f}"


def inference_table(rows: list[dict]) -> list[str]:
    lines = ["| SST-2 dev inference, tokens/s | BERT sdpa | BERT eager | ModernBERT sdpa | ModernBERT eager | sinebert | "
             "vs the fastest peer |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        # Rows saved before the key existed were of first-token pooling.
        what = (r["precision"] + (", compiled" if r.get("compiled") else "")
                + f", sinebert pooling {r.get('pooling', 'cls')}"
                + (f", batches of {r['batch_size']}" if r.get("batch_size", 32) != 32 else ""))
        peers = " | ".join(tokens(r, name) for name in ("bert", "bert_eager", "modernbert", "modernbert_eager"))
        lines.append(f"| {what} | {peers} | {tokens(r, 'sinebert')} | x{r['sinebert_vs_fastest_peer']:.2f} "
                     f"({r['fastest_peer']}) |")
    return lines


def markdown(report: dict) -> str:
    lines = [f"sinebert vs transformers' BERT and ModernBERT, {report['date']}, {report['machine']}; matmul peak "
             f"{report['peak_gflops']['fp32']:.0f} GFLOP/s fp32, {report['peak_gflops']['bf16']:.0f} bf16 (autocast)"
             + (f", measured {report['peak_date']}." if report.get("peak_date") else ".")
             + "".join(f" {part.capitalize()} rows measured {report[part + '_date']}."
                       for part in ("training", "inference") if report.get(f"{part}_date")), "",
             "| pretraining step, tokens/s | BERT sdpa | BERT without dropout | BERT eager | ModernBERT sdpa | "
             "ModernBERT eager | sinebert | vs the fastest peer | share of peak | sinebert, token dropping | "
             "vs the fastest peer |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["training"]:
        peak = report["peak_gflops"][r["precision"]]
        peers = " | ".join(tokens(r, name) for name in PEERS)
        lines.append(f"| {r['size']} {r['precision']} | {peers} | {tokens(r, 'sinebert')} | "
                     f"x{r['sinebert_vs_fastest_peer']:.2f} ({r['fastest_peer']}) | {r['sinebert_gflops'] / peak:.0%} | "
                     f"{tokens(r, 'sinebert_dropping')} | x{r['sinebert_dropping_vs_fastest_peer']:.2f} |")
    lines += [""] + inference_table(report["inference"])
    if report.get("curves"):
        lines += [""] + equal_time_table(report["curves"]) + [""] + curves_table(report["curves"])
    if report.get("memory"):
        measured = f" (measured {report['memory_date']})" if report.get("memory_date") else ""
        lines += ["", f"| peak RSS of training steps{measured} | " + " | ".join(
                  f"{LABELS[name]} MiB" for name in MEMORY_MODELS) + " |", "|---|---|---|---|"]
        for key, values in report["memory"].items():
            lines.append(f"| {key} | " + " | ".join(f"{values[name]:,.0f}" for name in MEMORY_MODELS) + " |")
    return "\n".join(lines) + "\n"


def machine() -> str:
    where = torch.cuda.get_device_name() if DEVICE.type == "cuda" else f"{torch.get_num_threads()} threads"
    return f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, {where}"


def cpu_name() -> str:
    """The CPU's model and its bf16 matrix instructions (which decide bf16's pace: docs/SPEED.md); without
    /proc/cpuinfo the architecture."""
    fields = cpu_fields()
    if not fields:
        return platform.machine()
    units = [name for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"))
             if flag in fields.get("flags", "").split()]
    return f"{fields.get('model name', platform.machine())} ({', '.join(units) or 'no bf16 instructions'})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--curve_steps", type=int, default=200)
    parser.add_argument("--name", default="speed",
                        help="The results' name in benchmarks/results (default: speed; say which machine's otherwise).")
    parser.add_argument("--remeasure", choices=("memory", "peak", "training", "inference"),
                        help="Redo only this part of benchmarks/results/NAME.json and rewrite the results.")
    parser.add_argument("--cell", nargs=2, metavar=("SIZE", "PRECISION"),
                        help="With --remeasure training: only this row (e.g. small fp32), where another job had "
                             "shared the machine.")
    parser.add_argument("--profile", action="store_true",
                        help="Profile one SST-2 dev inference pass of each, fp32 and bf16.")
    parser.add_argument("--inference_only", action="store_true", help="Measure only inference; print, do not save.")
    parser.add_argument("--compiled", action="store_true",
                        help="With --inference_only: every model torch.compile'd (dynamic shapes, freezing).")
    parser.add_argument("--bf16_weights", action="store_true",
                        help="With --inference_only: also every model with its weights cast to bf16, no autocast.")
    parser.add_argument("--batch_size", type=int, default=32,
                        help="With --inference_only: sentences per batch (default 32; 1 is one sentence at a time, "
                             "as pipeline(...) serves by default).")
    parser.add_argument("--classifier_pooling", choices=("mean", "cls"), default="mean",
                        help="With --inference_only: sinebert's classifier pooling (default mean, as its checkpoints "
                             "say; cls computes the last layer at the first token only).")
    parser.add_argument("--compiled_training", nargs=3, metavar=("SIZE", "PRECISION", "TASK"),
                        help="sinebert's training step (TASK mlm or classification) under torch.compile against "
                             "eager; print only.")
    parser.add_argument("--kernels", action="store_true",
                        help="Time the full-attention kernels alone, and the bf16 roundings; print only.")
    args = parser.parse_args()
    given = [f"--{dest}" for dest in ("compiled", "bf16_weights", "batch_size", "classifier_pooling")
             if getattr(args, dest) != parser.get_default(dest)]  # the flags only the serving rows read
    if given and not args.inference_only:
        parser.error(f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with --inference_only.")
    if args.batch_size < 1:
        parser.error(f"--batch_size must be at least 1, got {args.batch_size}.")
    if args.kernels:
        return print("\n".join(kernel_times() + [""] + small_kernel_times() + [""] + served_kernel_times() + [""]
                                + rounding_times()))
    if args.compiled_training:
        size, precision, task = args.compiled_training
        if task not in ("mlm", "classification"):
            parser.error(f"--compiled_training TASK is mlm or classification, got {task}.")
        result = compiled_training(size, precision, 2 if args.quick else 12, 2 if args.quick else 8, task)
        return print(f"{size} {precision} {task}: compiled {result['compiled_seconds']:.4f} s a step, eager "
                     f"{result['eager_seconds']:.4f} (first steps, compiling: {result['compile_seconds']:.0f} s)")
    if args.profile:
        return profile_inference(inference_batches(sst2_dev()))
    # bf16 runs in software on CPUs without bf16 instructions (on the AVX2-only AMD machine a bf16 step took 30x an
    # fp32 one): there, one timed step after one warm-up, at the small size only, one step for memory and one timed
    # inference pass.
    native = DEVICE.type == "cuda" or cpu_has_native_bf16()
    if args.inference_only:
        rows = inference_rows(args.quick, native, args.compiled, args.bf16_weights, args.classifier_pooling,
                              args.batch_size)
        lines = inference_table(rows)
        if args.compiled:
            lines += [f"first (compiling) pass, {r['precision']}: "
                      + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in r["compile_seconds"].items())
                      for r in rows]
        return print("\n".join(lines))
    if args.cell and args.remeasure != "training":
        parser.error("--cell goes with --remeasure training.")
    if args.remeasure:
        return remeasure(args.name, args.remeasure, args.steps, tuple(args.cell) if args.cell else None)
    steps = 2 if args.quick else args.steps
    cells = [(size, p) for size in SIZES for p in ("fp32", "bf16") if native or p == "fp32" or size == "small"]
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "native_bf16": native}
    print(f"{report['machine']}; matmul peak ...", flush=True)
    report["peak_gflops"] = peak_gflops()
    report["training"] = []
    for size, p in cells:
        print(f"training steps: {size} {p} ...", flush=True)
        report["training"].append(training_row(size, p, steps, native))
    report["inference"] = inference_rows(args.quick, native)
    if not args.quick:
        report["memory"] = memory_rows(cells, native)
        print(f"masked-token accuracy curves ({args.curve_steps} steps) ...", flush=True)
        report["curves"] = accuracy_curves(args.curve_steps, "bf16" if native else "fp32")
    print(markdown(report))
    if not args.quick:
        save(report, args.name)


def training_row(size: str, precision: str, steps: int, native: bool) -> dict:
    """One training row; bf16 without native bf16 runs one timed step after one warm-up (see main)."""
    if precision == "fp32" or native:
        return train_throughput(size, precision, steps, 2)
    return train_throughput(size, precision, 1, 1)


def inference_rows(quick: bool, native: bool, compiled: bool = False, bf16_weights: bool = False,
                   pooling: str = "mean", batch_size: int = 32) -> list[dict]:
    rows, batches = [], inference_batches(sst2_dev(), batch_size)
    for p in ("fp32", "bf16") + (("bf16 weights",) if bf16_weights else ()):
        print(f"SST-2 dev inference: {p}{' compiled' if compiled else ''} ...", flush=True)
        repeats = 1 if quick or (p != "fp32" and not native) else 7
        rows.append(inference_throughput(p, batches, repeats, compiled, pooling))
    return rows


def memory_rows(cells: list[tuple[str, str]], native: bool) -> dict:
    print("peak memory (a fresh process per cell) ...", flush=True)
    return {f"{size} {p}": {m: peak_memory(m, size, p, 3 if p == "fp32" or native else 1) for m in MEMORY_MODELS}
            for size, p in cells}


def remeasure(name: str, part: str, steps: int, cell: tuple[str, str] | None = None):
    report = json.loads((RESULTS / f"{name}.json").read_text())
    if part == "training":
        if cell and cell not in {(row["size"], row["precision"]) for row in report["training"]}:
            raise SystemExit(f"--cell {' '.join(cell)}: no such training row in the saved results.")
        report["training"] = [training_row(row["size"], row["precision"], steps, report["native_bf16"])
                              if cell in (None, (row["size"], row["precision"])) else row
                              for row in report["training"]]
    elif part == "inference":
        report["inference"] = inference_rows(False, report["native_bf16"])
    elif part == "memory":
        cells = [tuple(key.split()) for key in report["memory"]]
        report["memory"] = memory_rows(cells, report["native_bf16"])
    else:
        report["peak_gflops"] = peak_gflops()
    report[f"{part}_date"] = time.strftime("%Y-%m-%d")
    print(markdown(report))
    save(report, name)


def save(report: dict, name: str):
    """benchmarks/results/NAME.{json,md,png}."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(report))
    plot(report, RESULTS / f"{name}.png")


if __name__ == "__main__":
    main()
