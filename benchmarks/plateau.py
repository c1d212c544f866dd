"""The plateau of short MLM pretraining, isolated: how many steps until attention learns to read a neighbour.

    python benchmarks/plateau.py                  # about 10 minutes on 1 core
    python benchmarks/plateau.py --steps 1000     # shorter

Twenty minutes of the CPU cram leave the MLM loss on its plateau: the model predicts token frequencies and has not
yet learned to use the context. This benchmark isolates that phase on a task that only context can solve: sequences
of random token pairs (`a a b b c c ...`), 15% of positions replaced by [MASK], where each masked token is the other
half of its pair. Chance is a loss of ln(V); a model that has found its neighbour goes to 0. Every model trains on
the same batches from the same seed with AdamW at 1e-3; we report the step at which the mean training loss over the
last 50 steps first falls below half of ln(V). The models: sinebert with the cram recipe's full attention, sinebert
with a sliding window in every layer, sinebert with mimetic attention initialisation (`attention_init="mimetic"`, the
cram's pretraining), and Hugging Face's BertForMaskedLM (SDPA) of the same size.

Writes benchmarks/results/plateau.{json,md}.
"""

import argparse
import json
import math
import time
from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM

from sinebert import SineBertConfig, SineBertForMaskedLM

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
VOCAB, LENGTH, BATCH, MASK_ID, FIRST_TOKEN = 100, 64, 32, 4, 5
SIZE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
            pad_token_id=0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
CRAM = dict(norm_placement="pre", scale_embeddings=True)  # as configs/cram/pretrain.yaml
MODELS = {
    "sinebert, full attention": lambda: SineBertForMaskedLM(SineBertConfig(**SIZE, **CRAM)),
    "sinebert, local w=4 in every layer": lambda: SineBertForMaskedLM(SineBertConfig(**SIZE, **CRAM, sliding_window=4)),
    "sinebert, local w=8 in every layer": lambda: SineBertForMaskedLM(SineBertConfig(**SIZE, **CRAM, sliding_window=8)),
    "sinebert, full attention, mimetic init": lambda: SineBertForMaskedLM(
        SineBertConfig(**SIZE, **CRAM, attention_init="mimetic")
    ),
    "Hugging Face BERT (SDPA)": lambda: BertForMaskedLM(
        BertConfig(**SIZE, max_position_embeddings=LENGTH, attn_implementation="sdpa")
    ),
}


def pair_batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and labels `(BATCH, LENGTH)`: random pairs `a a b b ...`, 15% masked, labels only there."""
    tokens = torch.randint(FIRST_TOKEN, VOCAB, (BATCH, LENGTH // 2), generator=generator).repeat_interleave(2, dim=1)
    masked = torch.rand(BATCH, LENGTH, generator=generator) < 0.15
    return tokens.masked_fill(masked, MASK_ID), tokens.masked_fill(~masked, -100)


def steps_to_break_out(build, steps: int, seed: int) -> dict:
    """Train until the 50-step mean loss falls below half of chance, or for `steps`; returns when, and the curve."""
    torch.manual_seed(seed)
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    threshold, losses, curve, started = 0.5 * math.log(VOCAB - FIRST_TOKEN), [], [], time.perf_counter()
    for step in range(1, steps + 1):
        input_ids, labels = pair_batch(generator)
        loss = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0:
            mean = sum(losses[-50:]) / 50
            curve.append((step, round(mean, 3)))
            if mean < threshold:
                return {"break_out_step": step, "curve": curve, "seconds": time.perf_counter() - started}
    return {"break_out_step": None, "curve": curve, "seconds": time.perf_counter() - started}


def markdown(report: dict) -> str:
    seeds = report["seeds"]
    lines = ["| model | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for name, runs in report["rows"].items():
        cells = [f"step {r['break_out_step']:,}" if r["break_out_step"] else f"not in {report['steps']:,} steps "
                 f"(loss {r['curve'][-1][1]})" for r in runs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append(f"\nSteps until the 50-step mean training loss on the neighbour-pair task fell below half of chance "
                 f"({report['threshold']:.2f}; chance {2 * report['threshold']:.2f}). Hidden 64, 2 layers, 2 heads, "
                 f"FFN 256, vocabulary {VOCAB}, {BATCH} x {LENGTH} tokens, AdamW 1e-3, no dropout, 1 torch thread; "
                 f"{report['date']}, torch {report['torch']}. Command: `python benchmarks/plateau.py`.")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000, help="The most steps any model trains.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny matrices: more threads only add overhead
    rows = {}
    for name, build in MODELS.items():
        rows[name] = []
        for seed in args.seeds:
            result = steps_to_break_out(build, args.steps, seed)
            rows[name].append(result)
            print(f"{name}, seed {seed}: break-out step {result['break_out_step']} "
                  f"({result['seconds']:.0f} s)", flush=True)
    report = {"rows": rows, "steps": args.steps, "seeds": args.seeds, "threshold": 0.5 * math.log(VOCAB - FIRST_TOKEN),
              "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "plateau.json").write_text(json.dumps(report, indent=1) + "\n")
    (RESULTS / "plateau.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
