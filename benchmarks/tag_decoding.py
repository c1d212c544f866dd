"""How much the tag decoding gives a tagger: each word's most probable tag against the sentence's most probable
well-formed IOB2 sequence (`sinebert.tagging`), scored strictly and by conlleval's convention (seqeval's default).

    python -m benchmarks.tag_decoding --model runs/cram/conll2003-pretrained runs/cram/conll2003-scratch \\
        --file ../shared/data/conll2003/valid.txt runs/cram/data/conll2003/test.jsonl

Files: CoNLL columns (token first, IOB2 tag last) or jsonl rows {tokens, ner_tags}. Reads the models and files
only; writes benchmarks/results/tag_decoding.{json,md} (or --output).
"""

import argparse
import json
from pathlib import Path

import torch
from seqeval.metrics import f1_score

from recipes.demo_eval import read_tagged_jsonl, tagger_scores
from sinebert.tagging import iob2_transitions
from sinebert.training.metrics.seqeval_strict import compute_entities
from sinebert.training.ner import Sentence, read_conll, word_tags

RESULTS = Path(__file__).resolve().parent / "results" / "tag_decoding"


def read_sentences(path: Path) -> list[Sentence]:
    if path.suffix == ".jsonl":
        return read_tagged_jsonl(path)
    return read_conll(str(path), token_column=0, tag_column=-1)


def decodings(model: Path, sentences: list[Sentence], max_length: int, context: bool) -> dict:
    """Entity F1 (%) of the word-by-word tags (strict and conlleval) and of the best well-formed sequence."""
    scores = tagger_scores(model, sentences, max_length, context)
    names, gold = scores["names"], [s.tags for s in sentences]
    rows = [(scores["log_probs"][row], first) for row, first in scores["places"]]
    by_word = [[names[int(row[p].argmax())] if p is not None else "O" for p in first] for row, first in rows]
    sequence = [word_tags(row, first, names) for row, first in rows]
    allowed, opens = iob2_transitions(tuple(names))
    index = {name: i for i, name in enumerate(names)}
    orphans = sum(not (opens[index[tag]] if i == 0 else allowed[index[tags[i - 1]], index[tag]])
                  for tags in by_word for i, tag in enumerate(tags))
    return {
        "word_strict": 100 * compute_entities(by_word, gold)["overall_f1"],
        "word_conlleval": 100 * f1_score(gold, by_word),
        "sequence": 100 * compute_entities(sequence, gold)["overall_f1"],
        "sequence_conlleval": 100 * f1_score(gold, sequence),
        "orphan_i_tags": orphans,
    }


def table(results: list[dict]) -> str:
    lines = ["| tagger | file | word by word: strict / conlleval | best well-formed sequence | orphan I- tags |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['file']} | {r['word_strict']:.2f} / {r['word_conlleval']:.2f} | "
              f"**{r['sequence']:.2f}** | {r['orphan_i_tags']} |" for r in results]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", type=Path, required=True, help="saved tagger folders")
    parser.add_argument("--file", nargs="+", type=Path, required=True, help="CoNLL or jsonl files to score on")
    parser.add_argument("--max_length", type=int, default=128, help="as the taggers were trained (the cram: 128)")
    parser.add_argument("--document_context", action="store_true", help="for taggers trained with it")
    parser.add_argument("--output", type=Path, default=RESULTS, help="writes OUTPUT.json and OUTPUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for model in args.model:
        for path in args.file:
            results.append({"model": str(model), "file": str(path),
                            **decodings(model, read_sentences(path), args.max_length, args.document_context)})
            print(table(results[-1:]).splitlines()[-1], flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    args.output.with_suffix(".md").write_text("# Entity F1 by tag decoding\n\n" + table(results))
    print(f"Wrote {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    main()
