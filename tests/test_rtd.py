"""Replaced-token detection (ELECTRA): the loss against a hand computation, a generator that shares the
discriminator's word embeddings and samples from its own distribution, and `scripts/pretrain.py --objective rtd`
end to end: a discriminator that every Auto head loads, exact resume, two processes as one, streaming."""

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification

import sinebert  # noqa: F401  (registers the Auto classes)
from sinebert import SineBertForPreTraining
from sinebert.training.optimizer import build_optimizer
from sinebert.training.rtd import ReplacedTokenDetection, sample_from
from tests.conftest import launch_script, load_script, run_here, tiny_config, user_error

TINY = ["--hidden_size", 64, "--num_hidden_layers", 2, "--num_attention_heads", 4, "--intermediate_size", 128,
        "--max_seq_length", 64, "--logging_steps", 1, "--learning_rate", 1e-3, "--hidden_dropout_prob", 0,
        "--attention_probs_dropout_prob", 0, "--objective", "rtd"]
pretrain = load_script("pretrain")


def rtd_model(seed: int = 0) -> ReplacedTokenDetection:
    torch.manual_seed(seed)
    return ReplacedTokenDetection(SineBertForPreTraining(tiny_config()), fraction=0.5).eval()


def batch() -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 99, (2, 9), generator=generator)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 6:] = 0  # the second row is padded
    masked = torch.zeros_like(ids, dtype=torch.bool)
    masked[0, [1, 4, 7]] = masked[1, [2, 3]] = True
    return {"input_ids": torch.where(masked, 4, ids), "attention_mask": attention_mask,
            "labels": torch.where(masked, ids, -100), "sample_noise": torch.rand(2, 9, generator=generator)}


def softmax(logits: list[float], temperature: float = 1.0) -> list[float]:
    weights = [math.exp((x - max(logits)) / temperature) for x in logits]
    return [w / sum(weights) for w in weights]


def test_the_loss_is_the_generators_cross_entropy_plus_the_weighted_detection_loss():
    model, inputs = rtd_model(), batch()
    with torch.no_grad():
        out = model(**inputs)
        generator_logits = model.generator(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                           labels=inputs["labels"]).logits  # (5 masked, 99)
    masked = (inputs["labels"] != -100).nonzero().tolist()
    original = torch.where(inputs["labels"] != -100, inputs["labels"], inputs["input_ids"])
    corrupted = original.clone()
    cross_entropy = 0.0
    for row, ((i, j), logits) in enumerate(zip(masked, generator_logits.tolist())):
        cross_entropy -= math.log(softmax(logits)[int(inputs["labels"][i, j])])
        # The sample: the first token whose cumulative probability at the model's temperature reaches u.
        running, u = 0.0, float(inputs["sample_noise"][i, j])
        for token, p in enumerate(softmax(logits, model.temperature)):
            running += p
            if running >= u:
                break
        corrupted[i, j] = token
    with torch.no_grad():
        judged = model.discriminator(input_ids=corrupted, attention_mask=inputs["attention_mask"]).logits
    detection = 0.0
    for i in range(2):
        for j in range(9):
            if inputs["attention_mask"][i, j]:
                y, x = float(corrupted[i, j] != original[i, j]), float(judged[i, j])
                sigmoid = 1 / (1 + math.exp(-x))
                detection -= y * math.log(sigmoid) + (1 - y) * math.log(1 - sigmoid)
    expected = cross_entropy / len(masked) + 50 * 0.15 * detection / len(masked)
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    assert out.replaced[1, 6:].tolist() == [-100] * 3  # padding counts for nothing


def test_samples_follow_the_generators_distribution():
    logits = torch.log(torch.tensor([[0.2, 0.8, 1e-9]])).repeat(1000, 1)
    noise = (torch.arange(1000) + 0.5) / 1000  # evenly spread: exactly 20% land on token 0
    samples = sample_from(logits, noise)
    assert (samples == 0).sum() == 200 and (samples == 1).sum() == 800
    assert sample_from(torch.tensor([[0.0, 30.0, 0.0]]), torch.tensor([0.999999])).item() == 1
    flattened = sample_from(logits, noise, temperature=2.0)  # probabilities as sqrt(0.2) : sqrt(0.8) = 1/3 : 2/3
    assert (flattened == 0).sum() == 333 and (flattened == 1).sum() == 667


def test_the_model_samples_at_its_temperature():
    model, inputs = rtd_model(), batch()
    favourite = int(inputs["labels"][0, 1])
    with torch.no_grad():
        model.generator.decoder.bias[favourite] = 4.6  # about half the probability at temperature 1
    model.temperature = 1e-4  # the generator's most likely token, `favourite`, at every masked position
    with torch.no_grad():
        out = model(**inputs)
    masked = inputs["labels"] != -100
    assert out.replaced[masked].tolist() == (inputs["labels"][masked] != favourite).long().tolist()


def test_the_generator_reads_and_writes_through_the_discriminators_word_embeddings():
    model = rtd_model()
    words = model.discriminator.get_input_embeddings().weight
    out = model(**batch())
    out.generator_loss.backward()
    assert words.grad is not None and words.grad.abs().sum() > 0  # the generator's loss trains the shared vectors
    generator = sum(p.numel() for p in model.generator.parameters() if p is not words)
    assert generator < sum(p.numel() for p in model.discriminator.parameters()) / 2
    groups = build_optimizer(model, pretrain.parse_args(["--train_file", "x.txt", "--output_dir", "o"])).param_groups
    listed = [id(p) for group in groups for p in group["params"]]
    assert len(listed) == len(set(listed)) == len({id(p) for p in model.parameters()})


def data(text_corpus, tokenizer_dir):
    return ["--train_file", text_corpus / "train.txt", "--validation_file", text_corpus / "valid.txt",
            "--tokenizer_name", tokenizer_dir]


def losses(folder) -> dict[int, float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


@pytest.fixture(scope="module")
def full_run(text_corpus, tokenizer_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rtd") / "full"
    argv = [*data(text_corpus, tokenizer_dir), *TINY, "--per_device_train_batch_size", 8, "--max_train_steps", 16,
            "--eval_steps", 8, "--checkpointing_steps", 8]
    pretrain.main([str(a) for a in [*argv, "--output_dir", out]])
    return out, argv


def test_pretraining_saves_a_discriminator_that_every_auto_head_loads(full_run):
    out, _ = full_run
    evaluation = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
                  if "eval_detection_accuracy" in line]
    assert [row["step"] for row in evaluation] == [0, 8, 16]
    assert 0.05 < evaluation[-1]["eval_replaced_share"] < 0.15  # generator samples replace most masked tokens
    assert json.loads((out / "config.json").read_text())["architectures"] == ["SineBertForPreTraining"]
    weights = load_file(out / "model.safetensors")
    assert not any(name.startswith("generator") for name in weights)  # only the discriminator is kept
    assert type(AutoModelForPreTraining.from_pretrained(out)).__name__ == "SineBertForPreTraining"
    for auto in (AutoModel, AutoModelForSequenceClassification):
        model = auto.from_pretrained(out)
        encoder = model.state_dict()
        prefix = "" if auto is AutoModel else "sinebert."
        encoder_keys = [k for k in weights if k.startswith("sinebert.")]
        assert all(torch.equal(encoder[prefix + k.removeprefix("sinebert.")], weights[k]) for k in encoder_keys)
    card = (out / "README.md").read_text()
    assert "replaced-token detection" in card and "pipeline_tag: feature-extraction" in card


def test_resume_continues_exactly(full_run, tmp_path):
    out, argv = full_run
    stopped = tmp_path / "stopped"
    (stopped / "checkpoints").mkdir(parents=True)
    shutil.copytree(out / "checkpoints" / "step_00000008", stopped / "checkpoints" / "step_00000008")
    rows = (out / "metrics.jsonl").read_text().splitlines()
    (stopped / "metrics.jsonl").write_text("".join(r + "\n" for r in rows if json.loads(r)["step"] <= 8))
    pretrain.main([str(a) for a in [*argv, "--output_dir", stopped, "--resume_from_checkpoint", "latest"]])
    assert losses(stopped) == losses(out)
    a, b = load_file(out / "model.safetensors"), load_file(stopped / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_two_processes_match_one_process_with_twice_the_batch(text_corpus, tokenizer_dir, tmp_path):
    """Masks and the generator's samples are drawn per example, so the processes see what one process would."""
    common = [*data(text_corpus, tokenizer_dir), *TINY, "--max_train_steps", 6, "--eval_steps", 6]
    run_here("pretrain", *common, "--per_device_train_batch_size", 16, "--output_dir", tmp_path / "one")
    launch_script("pretrain", *common, "--per_device_train_batch_size", 8, "--output_dir", tmp_path / "two",
                  processes=2)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 7))
    for step in one:  # float32 sums in another order: 6.5e-6 apart (relative) after 6 steps on an AVX2-only CPU
        assert two[step] == pytest.approx(one[step], rel=2e-5)


def test_streaming_and_what_rtd_refuses(text_corpus, tokenizer_dir, tmp_path, capsys):
    out = tmp_path / "stream"
    pretrain.main([str(a) for a in [*data(text_corpus, tokenizer_dir), *TINY, "--streaming", "--max_train_steps", 4,
                                    "--per_device_train_batch_size", 8, "--output_dir", out]])
    assert sorted(losses(out)) == [1, 2, 3, 4]
    argv = [*data(text_corpus, tokenizer_dir), *TINY, "--token_dropping_layers", 0, -1, "--output_dir", tmp_path / "x"]
    assert "--token_dropping_layers does not apply to --objective rtd" in user_error(capsys, pretrain, argv)
    argv = [*data(text_corpus, tokenizer_dir), *TINY, "--generator_fraction", 2, "--output_dir", tmp_path / "y"]
    assert "--generator_fraction must be in (0, 1], got 2.0" in user_error(capsys, pretrain, argv)
    argv = [*data(text_corpus, tokenizer_dir), *TINY, "--generator_temperature", 0, "--output_dir", tmp_path / "z"]
    assert "--generator_temperature must be above 0, got 0.0" in user_error(capsys, pretrain, argv)


def test_mixed_lengths_cut_the_sample_noise_with_the_tokens():
    from sinebert.training.mlm import cut_blocks

    inputs = batch()
    cut = cut_blocks(inputs, 4, pad_token_id=0)  # (2, 9) -> rows of 4: 3 pieces of row 0, 2 of row 1
    assert set(cut) == set(inputs) and cut["sample_noise"].shape == cut["input_ids"].shape == (5, 4)
    assert torch.equal(cut["sample_noise"][0], inputs["sample_noise"][0, :4])
    assert torch.equal(cut["sample_noise"][3], inputs["sample_noise"][1, :4])
