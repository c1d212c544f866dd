"""Train a BERT-style WordPiece tokenizer on the same inputs pretraining accepts.

    python scripts/train_tokenizer.py --train_file corpus/*.txt --vocab_size 16000 --output_dir runs/tokenizer

The folder loads with `AutoTokenizer.from_pretrained(output_dir)` as a fast tokenizer that adds [CLS]/[SEP].
"""

import argparse
import json
from pathlib import Path

from sinebert.training.arguments import ArgumentParser, parse_with_config_file
from sinebert.training.data import add_text_arguments, training_texts
from sinebert.training.errors import UserError, run_cli, write_staged
from sinebert.training.lock import RunLock, take_folder
from sinebert.training.tokenizer import SPECIAL_TOKENS, train_wordpiece


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_text_arguments(parser)
    parser.add_argument("--streaming", action="store_true", help="Read the data lazily (corpora beyond memory).")
    parser.add_argument("--vocab_size", type=int, default=16000)
    parser.add_argument("--min_frequency", type=int, default=2, help="Minimum count of a merged pair.")
    parser.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=True,
                        help="Lower-case and strip accents (uncased), or keep case (--no-lowercase).")
    parser.add_argument("--model_max_length", type=int, default=512, help="The tokenizer's maximum input length.")
    for name, token in SPECIAL_TOKENS.items():
        parser.add_argument(f"--{name}", default=token, help=f"Default {token}.")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--overwrite_output_dir", action="store_true")
    return parse_with_config_file(parser, argv)


def main(argv=None):
    args = parse_args(argv)
    output = Path(args.output_dir)
    if (output / "tokenizer.json").exists() and not args.overwrite_output_dir:
        raise UserError(f"{output} already holds a tokenizer; pass --overwrite_output_dir to replace it.")
    refused = take_folder(output)  # one job per folder, as for the training scripts
    if refused:
        raise UserError(refused)
    special = {name: getattr(args, name) for name in SPECIAL_TOKENS}
    tokenizer = train_wordpiece(training_texts(args, args.streaming), args.vocab_size, args.min_frequency,
                                args.lowercase, special, args.model_max_length)
    summary = {"vocab_size": len(tokenizer), "lowercase": args.lowercase, "min_frequency": args.min_frequency,
               "data": args.dataset_name or args.train_file}
    save(tokenizer, summary, output)
    RunLock.release()
    print(f"Saved a WordPiece tokenizer of {len(tokenizer)} tokens to {output}.")


def save(tokenizer, summary: dict, output: Path):
    """Write every file, tokenizer.json (whose presence marks a finished tokenizer) last, through a staging folder:
    a killed save leaves no partly written file."""

    def write(staging: Path):
        tokenizer.save_pretrained(staging)
        (staging / "tokenizer_training.json").write_text(json.dumps(summary, indent=2) + "\n")

    reason = write_staged(output, "tokenizer", write, last="tokenizer.json")
    if reason:
        raise UserError(f"Could not save the tokenizer into {output} because {reason}; free space, then rerun the "
                        "same command.")


if __name__ == "__main__":
    run_cli(main)
