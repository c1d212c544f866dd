"""Serving throughput of the exported ONNX graph (onnxruntime, CPU) beside the eager model, for sinebert and for
Hugging Face BERT of the same size, on the SST-2 dev sentences in batches of 32 padded to the longest.

    python benchmarks/onnx_inference.py            # writes benchmarks/results/onnx_inference.{json,md}
    python benchmarks/onnx_inference.py --quick    # one timed pass of the first 8 batches, printed only

The models are speed.py's classifiers at its small size (fp32, random weights: speed does not depend on them). The
ONNX graphs take the padded path (every position computed), where eager sinebert drops the padding; the ratios say
what serving through onnxruntime gains or loses against each model's eager forward, in one run, interleaved.
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.speed import RESULTS, inference_batches, machine, models, seconds_of, sst2_dev  # noqa: E402
from sinebert.export import export_onnx  # noqa: E402


def bert_onnx(model, path: Path) -> Path:
    """BERT through the same exporter, dynamic batch and sequence axes."""
    batch, seq = torch.export.Dim("batch", min=1), torch.export.Dim("sequence", min=2)
    example = (torch.ones(2, 16, dtype=torch.long), torch.ones(2, 16, dtype=torch.long),
               torch.zeros(2, 16, dtype=torch.long))
    program = torch.onnx.export(model, example, dynamo=True,
                                input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["logits"],
                                dynamic_shapes=({0: batch, 1: seq},) * 3, optimize=True, verbose=False)
    program.save(str(path))
    return path


def session(path: Path) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def onnx_pass(sess, batches: list[dict]):
    names = [i.name for i in sess.get_inputs()]
    feeds = [{name: batch[name].numpy() if name in batch else np.zeros_like(batch["input_ids"].numpy())
              for name in names} for batch in batches]
    return lambda: [sess.run(None, feed) for feed in feeds]


def measure(quick: bool) -> dict:
    batches = inference_batches(sst2_dev())
    if quick:
        batches = batches[:8]
    sinebert, bert = (m.eval() for m in models("small", task="classification"))
    folder = Path(tempfile.mkdtemp())
    passes = {
        "sinebert eager": lambda: [sinebert(**b) for b in batches],
        "sinebert onnxruntime": onnx_pass(session(export_onnx(sinebert, folder / "sinebert.onnx")), batches),
        "BERT eager (sdpa)": lambda: [bert(**b) for b in batches],
        "BERT onnxruntime": onnx_pass(session(bert_onnx(bert, folder / "bert.onnx")), batches),
    }
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    repeats = 1 if quick else 5
    times = {name: [] for name in passes}
    with torch.no_grad():
        for repeat in range(repeats + 1):  # the first pass of each is untimed
            for name, run in passes.items():
                seconds = seconds_of(run)
                if repeat:
                    times[name].append(seconds)
    rates = {name: tokens / statistics.median(values) for name, values in times.items()}
    fastest_peer = max(rates["BERT eager (sdpa)"], rates["BERT onnxruntime"])
    return {"machine": machine(), "threads": torch.get_num_threads(), "onnxruntime": onnxruntime.__version__,
            "batches": len(batches), "real_tokens": tokens, "tokens_per_second": rates,
            "sinebert_onnx_vs_eager": rates["sinebert onnxruntime"] / rates["sinebert eager"],
            "sinebert_onnx_vs_fastest_bert": rates["sinebert onnxruntime"] / fastest_peer,
            "sinebert_eager_vs_fastest_bert": rates["sinebert eager"] / fastest_peer}


def markdown(report: dict) -> str:
    lines = [f"SST-2 dev inference, fp32, batches of 32 padded to the longest ({report['real_tokens']:,} real tokens), "
             f"{report['machine']}, onnxruntime {report['onnxruntime']}; "
             "`python benchmarks/onnx_inference.py`.", "", "| model | tokens/s |", "|---|---|"]
    lines += [f"| {name} | {rate:,.0f} |" for name, rate in report["tokens_per_second"].items()]
    lines += ["", f"sinebert through onnxruntime: x{report['sinebert_onnx_vs_eager']:.2f} its eager forward, "
              f"x{report['sinebert_onnx_vs_fastest_bert']:.2f} the fastest BERT row; sinebert eager: "
              f"x{report['sinebert_eager_vs_fastest_bert']:.2f} the fastest BERT row."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 batches, one timed pass, nothing saved.")
    args = parser.parse_args()
    report = measure(args.quick)
    print(markdown(report))
    if not args.quick:
        (RESULTS / "onnx_inference.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "onnx_inference.md").write_text(markdown(report))


if __name__ == "__main__":
    main()
