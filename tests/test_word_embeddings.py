"""scripts/train_word_embeddings.py (CBOW) and pretraining that starts from its embeddings."""

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

from sinebert.training.embeddings import CBOW, FILE_NAME, context_windows, load_word_embeddings, train_cbow
from tests.conftest import load_script, run_here, user_error

TINY = ["--hidden_size", "64", "--num_hidden_layers", "2", "--num_attention_heads", "4", "--intermediate_size", "128",
        "--max_seq_length", "64", "--hidden_dropout_prob", "0", "--attention_probs_dropout_prob", "0"]


def cbow_args(**overrides):
    values = dict(embedding_size=16, window=2, negatives=5, noise_samples=32, batch_size=256, learning_rate=1e-2,
                  max_train_minutes=None, max_train_steps=300, logging_steps=1000, seed=0)
    return SimpleNamespace(**values | overrides)


def test_context_windows_stop_at_line_ends():
    stream = torch.tensor([5, 6, 7, -1, 8, 9, -1])
    windows = context_windows(stream, torch.tensor([1, 4, 0]), window=2, pad_id=99)
    assert windows.tolist() == [[99, 5, 7, 99],   # 6: its line is 5 6 7
                                [99, 99, 9, 99],  # 8: its line is 8 9
                                [99, 99, 6, 7]]   # 5: the stream's start is a line start


def test_cbow_loss_reads_the_mean_of_the_context_inside_the_line_against_shared_noise():
    torch.manual_seed(0)
    model = CBOW(vocab_size=6, size=4, negatives=3)
    with torch.no_grad():
        model.outputs.normal_()
    contexts, targets, noise = torch.tensor([[1, 6, 6, 2], [6, 3, 4, 5]]), torch.tensor([0, 2]), torch.tensor([4, 1])
    hidden = torch.stack([model.inputs[[1, 2]].mean(0), model.inputs[[3, 4, 5]].mean(0)])  # id 6: past the line
    positive = F.logsigmoid((hidden * model.outputs[targets]).sum(-1))
    negative = F.logsigmoid(-hidden @ model.outputs[noise].T).sum(-1) * 3 / 2  # each of 2 samples counts 3/2
    torch.testing.assert_close(model(contexts, targets, noise), -(positive.mean() + negative.mean()))


def test_cbow_learns_which_tokens_share_contexts():
    # Lines of tokens 0-9 only and lines of tokens 10-19 only: a token's context tells its group.
    generator = torch.Generator().manual_seed(0)
    lines = [torch.randint(10, (8,), generator=generator) + 10 * (i % 2) for i in range(400)]
    stream = torch.cat([torch.cat([line, torch.tensor([-1])]) for line in lines])
    vectors, summary = train_cbow(stream, 20, cbow_args())
    assert vectors.shape == (20, 16) and summary["train_steps"] == 300
    unit = torch.nn.functional.normalize(vectors, dim=1)
    similarity = unit @ unit.T
    same = torch.block_diag(torch.ones(10, 10), torch.ones(10, 10)).bool() & ~torch.eye(20, dtype=torch.bool)
    across = ~torch.block_diag(torch.ones(10, 10), torch.ones(10, 10)).bool()
    assert similarity[same].mean() > 0.9 and similarity[across].mean() < 0.5


@pytest.fixture(scope="module")
def embeddings(text_corpus, tokenizer_dir, tmp_path_factory):
    output = tmp_path_factory.mktemp("embeddings")
    run_here("train_word_embeddings",
        "--train_file", text_corpus / "train.txt", "--tokenizer_name", tokenizer_dir, "--embedding_size", 64,
        "--max_train_steps", 40, "--batch_size", 1024, "--output_dir", output, "--overwrite_output_dir")
    return output


def pretrain_args(text_corpus, tokenizer_dir, output, *extra):
    return [str(a) for a in ["--train_file", text_corpus / "train.txt", "--validation_file", text_corpus / "valid.txt",
                             "--tokenizer_name", tokenizer_dir, *TINY, "--per_device_train_batch_size", 4,
                             "--max_eval_samples", 8, "--output_dir", output, *extra]]


def test_script_writes_embeddings_tied_to_the_tokenizer(embeddings, tokenizer_dir):
    summary = json.loads((embeddings / "all_results.json").read_text())
    assert summary["train_steps"] == 40 and summary["train_tokens"] == 40 * 1024 and summary["corpus_tokens"] > 10_000
    matrix = load_file(str(embeddings / FILE_NAME))["word_embeddings"]
    assert matrix.shape == (600, 64) and torch.isfinite(matrix).all()
    with safe_open(str(embeddings / FILE_NAME), framework="pt") as handle:
        assert len(handle.metadata()["vocabulary_sha256"]) == 64
    assert not (embeddings / "word_embeddings.partial").exists()  # written atomically


def test_pretraining_starts_from_the_embeddings(embeddings, text_corpus, tokenizer_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    out = tmp_path / "pretrain"
    load_script("pretrain").main(pretrain_args(text_corpus, tokenizer_dir, out, "--max_train_steps", 2,
                                               "--learning_rate", "1e-3", "--init_word_embeddings", embeddings))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    expected = load_word_embeddings(str(embeddings), tokenizer, 64, std=0.02)
    trained = load_file(str(out / "model.safetensors"))["sinebert.embeddings.word_embeddings.weight"]
    # Two Adam steps of at most 1e-3 each away from the CBOW vectors; a random start differs by ~0.03 per entry.
    assert (trained[:600] - expected).abs().max() < 3e-3
    assert abs(expected.std().item() - 0.02) < 1e-4 and expected.mean(0).abs().max() < 1e-6  # the common part gone
    assert "word embeddings" in (out / "README.md").read_text()
    error = user_error(capsys, load_script("pretrain"), pretrain_args(
        text_corpus, tokenizer_dir, tmp_path / "again", "--max_train_steps", 1, "--model_name_or_path", out,
        "--init_word_embeddings", embeddings))
    assert "give only one of the two" in error


def test_bad_embeddings_get_one_clear_error(embeddings, text_corpus, tokenizer_dir, tmp_path, capsys):
    from sinebert.training.tokenizer import train_wordpiece

    pretrain = load_script("pretrain")
    error = user_error(capsys, pretrain, pretrain_args(text_corpus, tokenizer_dir, tmp_path / "a",
                                                       "--max_train_steps", 1, "--hidden_size", 32,
                                                       "--init_word_embeddings", embeddings))
    assert "has vectors of size 64 but the model's hidden_size is 32" in error
    other = tmp_path / "other-tokenizer"
    train_wordpiece(["a few words of other text"] * 50, vocab_size=200, min_frequency=1).save_pretrained(other)
    error = user_error(capsys, pretrain, pretrain_args(text_corpus, other, tmp_path / "b", "--max_train_steps", 1,
                                                       "--init_word_embeddings", embeddings))
    assert "was trained with another tokenizer" in error
    error = user_error(capsys, pretrain, pretrain_args(text_corpus, tokenizer_dir, tmp_path / "c",
                                                       "--max_train_steps", 1, "--init_word_embeddings", tmp_path))
    assert f"no {FILE_NAME} there" in error
    script = load_script("train_word_embeddings")
    error = user_error(capsys, script, ["--train_file", text_corpus / "train.txt", "--tokenizer_name", tokenizer_dir,
                                        "--output_dir", tmp_path / "d"])
    assert "Give a budget with --max_train_minutes or --max_train_steps." in error
