r"""Train word embeddings (CBOW with negative sampling) for the tokenizer's vocabulary, to start pretraining from.

    python scripts/train_word_embeddings.py --train_file corpus/*.txt --tokenizer_name runs/tokenizer \
        --embedding_size 256 --max_train_minutes 5 --output_dir runs/embeddings
    accelerate launch scripts/pretrain.py ... --hidden_size 256 --init_word_embeddings runs/embeddings

One process on the CPU threads torch is given; it writes word_embeddings.safetensors (with the tokenizer's digest,
checked when pretraining loads it) and all_results.json.
"""

import argparse
import json
from pathlib import Path

import torch

from sinebert.training.arguments import ArgumentParser, parse_with_config_file
from sinebert.training.data import add_text_arguments, training_texts
from sinebert.training.embeddings import FILE_NAME, save_word_embeddings, token_stream, train_cbow
from sinebert.training.errors import UserError, run_cli
from sinebert.training.models import load_tokenizer


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_text_arguments(parser)
    parser.add_argument("--tokenizer_name", required=True, help="The tokenizer pretraining will use.")
    parser.add_argument("--model_name_or_path", help=argparse.SUPPRESS)  # load_tokenizer reads it; never set here
    parser.add_argument("--trust_remote_code", action="store_true", help="Allow hub tokenizers that ship code.")
    parser.add_argument("--embedding_size", type=int, default=256, help="The encoder's hidden_size.")
    parser.add_argument("--window", type=int, default=5, help="Context tokens on each side (within the line).")
    parser.add_argument("--negatives", type=int, default=10, help="Negative samples per predicted token.")
    parser.add_argument("--noise_samples", type=int, default=128, help="Noise tokens drawn per batch, shared by it.")
    parser.add_argument("--batch_size", type=int, default=8192, help="Predicted tokens per step.")
    parser.add_argument("--learning_rate", type=float, default=3e-3, help="Adam's, decaying linearly to 0.")
    parser.add_argument("--max_train_minutes", type=float, help="Training time (the learning rate decays over it).")
    parser.add_argument("--max_train_steps", type=int, help="Steps, as an alternative or a cap.")
    parser.add_argument("--logging_steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--overwrite_output_dir", action="store_true")
    return parse_with_config_file(parser, argv)


def check_args(args):
    if not args.max_train_minutes and not args.max_train_steps:
        raise UserError("Give a budget with --max_train_minutes or --max_train_steps.")
    for name in ("embedding_size", "window", "negatives", "noise_samples", "batch_size", "logging_steps"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name} must be at least 1, got {getattr(args, name)}.")
    if (Path(args.output_dir) / FILE_NAME).exists() and not args.overwrite_output_dir:
        raise UserError(f"{args.output_dir} already holds {FILE_NAME}; pass --overwrite_output_dir to replace it.")


def main(argv=None):
    args = parse_args(argv)
    check_args(args)
    tokenizer = load_tokenizer(args)
    stream = token_stream((row for row in training_texts(args) if row), tokenizer)
    print(f"{int((stream >= 0).sum()):,} tokens; CBOW on {torch.get_num_threads()} CPU threads.", flush=True)
    matrix, summary = train_cbow(stream, len(tokenizer), args)
    summary["data"] = args.dataset_name or args.train_file
    output = Path(args.output_dir)
    path = save_word_embeddings(output, matrix, tokenizer, summary)
    (output / "all_results.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{summary['train_steps']} steps ({summary['epochs']:.1f} epochs, "
          f"{summary['train_tokens_per_second']:,.0f} tokens/s); wrote {path}.", flush=True)


if __name__ == "__main__":
    run_cli(main)
