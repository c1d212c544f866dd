r"""Save the attention heatmaps of a saved checkpoint for one text: one PNG, a heatmap per layer and head.

    python scripts/visualize_attention.py --model_name_or_path runs/demo/pretrain \
        --text "the president spoke to the congress ." --output_file attention.png

Any sinebert checkpoint works (pretrained, classifier, tagger): the encoder is loaded with the eager attention
kernel, which returns the weights. Rows of a heatmap are the attending tokens, columns the attended ones.
"""

import argparse
from pathlib import Path

import sinebert  # noqa: F401  (registers the Auto classes)
from sinebert.training.attention import attention_maps, plot_attention_grid
from sinebert.training.arguments import ArgumentParser
from sinebert.training.errors import run_cli


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", required=True, help="A saved checkpoint folder.")
    parser.add_argument("--text", required=True, help="The text whose attention to show.")
    parser.add_argument("--output_file", help="The PNG to write (default: attention.png in the checkpoint folder).")
    parser.add_argument("--max_length", type=int, default=48, help="Show at most this many tokens of the text.")
    parser.add_argument("--title", help="The figure's title (default: the checkpoint and the text).")
    parser.add_argument("--trust_remote_code", action="store_true", help="Allow checkpoints that ship code.")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    tokens, weights = attention_maps(args.model_name_or_path, args.text, args.max_length, args.trust_remote_code)
    output = Path(args.output_file or Path(args.model_name_or_path) / "attention.png")
    title = args.title or f"{args.model_name_or_path}: {args.text}"
    plot_attention_grid(tokens, weights, output, title)
    layers, heads = weights.shape[:2]
    print(f"Saved the attention of {layers} layers x {heads} heads over {len(tokens)} tokens to {output}.")


if __name__ == "__main__":
    run_cli(main)
