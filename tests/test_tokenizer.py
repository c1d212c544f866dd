"""scripts/train_tokenizer.py: trains on the inputs pretraining accepts and reloads through AutoTokenizer."""

import csv
import errno
import fcntl
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from sinebert.training.tokenizer import SPECIAL_TOKENS, _renumbered, train_wordpiece
from tests.conftest import ROOT, load_script, user_error

train_tokenizer = load_script("train_tokenizer")


def run_script(*args):
    train_tokenizer.main([str(a) for a in args])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sentences):
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "part1.txt").write_text("\n".join(sentences[:2000]) + "\n\n   \n", encoding="utf-8")
    (folder / "part2.txt").write_text("\n".join(sentences[2000:]) + "\n", encoding="utf-8")
    return folder


def test_trains_on_globbed_text_files_and_reloads(corpus, tmp_path):
    run_script("--train_file", corpus / "part*.txt", "--vocab_size", 700, "--output_dir", tmp_path / "tok")
    # Moved in from a staging folder, and the folder's lock given back: nothing else is left there.
    assert sorted(p.name for p in (tmp_path / "tok").iterdir()) == [
        "tokenization_sinebert.py", "tokenizer.json", "tokenizer_config.json", "tokenizer_training.json"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert tokenizer.is_fast and len(tokenizer) == 700
    assert [tokenizer.pad_token_id, tokenizer.mask_token_id] == [0, 4]
    text = "a gorgeous , witty , seductive movie ."
    encoded = tokenizer(text)
    assert encoded["input_ids"][0] == tokenizer.cls_token_id and encoded["input_ids"][-1] == tokenizer.sep_token_id
    # WordPiece keeps words and punctuation but not the spaces before punctuation
    assert tokenizer.decode(encoded["input_ids"], skip_special_tokens=True).replace(" ", "") == text.replace(" ", "")
    assert tokenizer.decode(tokenizer("a gorgeous witty movie")["input_ids"], skip_special_tokens=True) == (
        "a gorgeous witty movie"
    )
    assert tokenizer.decode(tokenizer("The Movie")["input_ids"], skip_special_tokens=True) == "the movie"


def test_uncased_folds_accents_as_bert_uncased_and_a_merge_needs_min_frequency():
    texts = ["the café is open today"] * 20 + ["a zebracorn"]
    uncased = train_wordpiece(texts, vocab_size=200, min_frequency=2)
    assert uncased("Café")["input_ids"] == uncased("cafe")["input_ids"]
    # Seen once, the word's letter pairs never reach two counts: it stays in single letters unless 1 is enough.
    assert uncased.tokenize("zebracorn")[:2] == ["z", "##e"]
    assert train_wordpiece(texts, vocab_size=200, min_frequency=1).tokenize("zebracorn") == ["zebracorn"]


def test_ids_depend_only_on_the_vocabulary_not_on_the_trainers_numbering(sentences):
    """The WordPiece trainer numbers its '##' pieces in hash-map order; without renumbering, trainings on the same
    text gave other ids to the same tokens, and a model is only valid with the ids it was trained with."""
    vocab = train_wordpiece(sentences[:3000], vocab_size=700).backend_tokenizer.get_vocab()
    assert [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])][:5] == list(SPECIAL_TOKENS.values())
    for seed in (0, 1):  # the same tokens numbered in another order, as another training numbers them
        shuffled = dict(zip(vocab, random.Random(seed).sample(range(len(vocab)), len(vocab))))
        assert Tokenizer(_renumbered(shuffled, SPECIAL_TOKENS)).get_vocab() == vocab


def test_pairs_get_segment_ids(corpus, tmp_path):
    run_script("--train_file", corpus / "part1.txt", "--vocab_size", 500, "--output_dir", tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    pair = tokenizer("the plot is thin", "the acting is fine")
    ids, types = pair["input_ids"], pair["token_type_ids"]
    first_sep = ids.index(tokenizer.sep_token_id)
    assert ids.count(tokenizer.sep_token_id) == 2 and ids[0] == tokenizer.cls_token_id
    assert set(types[: first_sep + 1]) == {0} and set(types[first_sep + 1 :]) == {1}


def test_cased_csv_column_and_special_tokens(tmp_path, sentences):
    table = tmp_path / "reviews.csv"
    with table.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["id", "review"])
        writer.writerows([i, s.capitalize()] for i, s in enumerate(sentences[:1500]))
    run_script("--train_file", table, "--text_column_name", "review", "--no-lowercase", "--vocab_size", 400,
               "--mask_token", "<mask>", "--output_dir", tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert tokenizer.mask_token == "<mask>"
    assert tokenizer.decode(tokenizer("The Movie")["input_ids"], skip_special_tokens=True) == "The Movie"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (["missing.txt"], "missing.txt does not exist"),
        (["nothing-*.txt"], "matched no file"),
        (["empty.txt"], "empty.txt is empty"),
        (["latin1.txt"], "latin1.txt line 2 is not valid utf-8"),
        (["blank.txt"], "every input line was empty"),
    ],
)
def test_bad_input_gets_one_clear_sentence(tmp_path, capsys, files, message):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes("first line\ncaf\u00e9 au lait\n".encode("latin-1"))
    (tmp_path / "blank.txt").write_text("\n   \n\n")
    argv = ["--train_file", *[tmp_path / f for f in files], "--output_dir", tmp_path / "tok"]
    assert message in user_error(capsys, train_tokenizer, argv)


def test_a_folder_another_job_holds_is_refused_before_training(corpus, tmp_path, capsys):
    out = tmp_path / "tok"
    out.mkdir()
    with open(out / ".sinebert.lock", "a+") as held:  # as a running job holds it (the kernel's lock, another file)
        held.write("host elsewhere, pid 1, since 2026-12-06 09:00:00\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        message = user_error(capsys, train_tokenizer, ["--train_file", corpus / "part1.txt", "--output_dir", out])
    assert f"--output_dir {out} is in use by another job (host elsewhere, pid 1, since 2026-12-06 09:00:00)" in message
    assert sorted(p.name for p in out.iterdir()) == [".sinebert.lock"]  # the holder's file, untouched


def test_a_system_without_flock_is_refused_before_anything_is_written(corpus, tmp_path, capsys, monkeypatch):
    """Windows has no fcntl: one sentence that says where the scripts run, not a ModuleNotFoundError."""
    monkeypatch.setitem(sys.modules, "fcntl", None)  # `import fcntl` now fails as it does there
    out = tmp_path / "tok"
    message = user_error(capsys, train_tokenizer, ["--train_file", corpus / "part1.txt", "--output_dir", out])
    assert message == (f"error: --output_dir {out} cannot be locked for this job: the lock is fcntl's flock, which "
                       f"this system ({sys.platform}) lacks; run sinebert's scripts on Linux or macOS, or under WSL 2 "
                       "on Windows.")
    assert not out.exists()


def test_a_full_disk_while_saving_is_one_sentence_and_leaves_no_partial_tokenizer(corpus, tmp_path, capsys,
                                                                                   monkeypatch):
    """The last file written (tokenizer_training.json) fails as on a full disk: nothing reaches the folder, which the
    run created and so removes, and a rerun is not refused as "already holds a tokenizer"."""
    out = tmp_path / "tok"
    real_write = Path.write_text

    def full(path, *args, **kwargs):
        if path.name == "tokenizer_training.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    message = user_error(capsys, train_tokenizer, ["--train_file", corpus / "part1.txt", "--vocab_size", 700,
                                                   "--output_dir", out])
    assert message == f"error: Could not save the tokenizer into {out} because the disk is full; free space, then " \
                      "rerun the same command."
    assert not out.exists()


def test_command_line_error_has_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_tokenizer.py"), "--train_file", str(tmp_path / "none.txt"),
         "--output_dir", str(tmp_path / "tok")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"error: --train_file {tmp_path / 'none.txt'} does not exist or is not a file."
