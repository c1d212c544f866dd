"""Export a sinebert checkpoint (any head) to ONNX with dynamic batch and sequence axes, and check the graph.

    python scripts/export_onnx.py --model_name_or_path runs/sst2 --output_file runs/sst2/model.onnx

The head is the one the checkpoint was saved as (`architectures` in its config). After export, onnxruntime runs
the graph on a padded batch of another shape than the one traced and compares it with the eager model at every real
token; a difference above --atol fails the export. Needs the `onnx` extra (`pip install ".[onnx]"`).
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoConfig

import sinebert
from sinebert.export import OUTPUT_NAMES, example_inputs, export_onnx
from sinebert.training.arguments import ArgumentParser
from sinebert.training.errors import UserError, run_cli


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", required=True, help="A saved sinebert folder (or hub name).")
    parser.add_argument("--output_file", required=True, help="Where the .onnx file goes.")
    parser.add_argument("--opset_version", type=int, default=18)
    parser.add_argument("--atol", type=float, default=1e-4, help="Largest difference from eager that passes.")
    return parser.parse_args(argv)


def load_head(name_or_path: str) -> torch.nn.Module:
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        raise UserError(f"Could not load a config from --model_name_or_path {name_or_path}: {error}") from None
    architecture = (config.architectures or ["SineBertModel"])[0]
    if config.model_type != "sinebert" or architecture not in OUTPUT_NAMES:
        raise UserError(
            f"--model_name_or_path {name_or_path} holds a {config.model_type} model ({architecture}); this script "
            f"exports sinebert heads ({', '.join(sorted(OUTPUT_NAMES))})."
        )
    return getattr(sinebert, architecture).from_pretrained(name_or_path).eval()


def largest_difference(model: torch.nn.Module, onnx_file: Path) -> float:
    """Max |onnxruntime - eager| over the real tokens of a padded batch of 3 x 37 (traced at 2 x 16)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    inputs = dict(zip(names, example_inputs(model.config, batch=3, seq=37)))
    inputs["attention_mask"][0, 20:] = 0
    with torch.no_grad():
        expected = model(**inputs, return_dict=False)
    served = session.run(None, {name: tensor.numpy() for name, tensor in inputs.items()})
    real = inputs["attention_mask"].bool()
    differences = []
    for got, want in zip(served, expected):
        difference = (torch.from_numpy(got) - want).abs()
        differences.append(difference[real] if difference.dim() >= 2 and difference.shape[1] == real.shape[1]
                           else difference)
    return max(float(d.max()) for d in differences)


def main(argv=None):
    args = parse_args(argv)
    output = Path(args.output_file)
    if output.suffix != ".onnx":
        raise UserError(f"--output_file {output} should end in .onnx.")
    model = load_head(args.model_name_or_path)
    export_onnx(model, output, args.opset_version)
    try:
        difference = largest_difference(model, output)
    except ImportError:
        print(f"Exported {output}; install onnxruntime to check it against the eager model.")
        return
    if difference > args.atol:
        output.unlink()
        raise UserError(
            f"The ONNX graph differs from the eager model by {difference:.2e} (more than --atol {args.atol}) on a "
            "padded batch; it was not kept. Please report this with the checkpoint's config.json."
        )
    print(f"Exported {output}: onnxruntime matches the eager model within {difference:.1e} on a padded batch.")


if __name__ == "__main__":
    run_cli(main)
