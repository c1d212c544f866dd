"""The three fine-tuning scripts end to end through `accelerate launch`, each on a slice of real data with a tiny
model trained from scratch: they beat a trivial baseline on held-out rows, and the folder they save serves a
pipeline that predicts what the script's own predictions file says."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, pipeline

import sinebert  # noqa: F401  (registers the Auto classes and the QA pipeline)
from sinebert.tagging import IOB2TaggingPipeline
from sinebert.training.metrics.seqeval_strict import compute_entities
from sinebert.training.metrics.squad import compute_squad
from sinebert.training.ner import read_conll
from sinebert.training.qa import read_squad_json
from sinebert.training.tokenizer import train_wordpiece
from tests.conftest import (check_model_card, entity_spans, launch_script, load_script, run_here, torch_threads,
                            user_error)
from tests.fixtures import corpus

# hidden 64, 2 layers; embeddings scaled by sqrt(hidden) so the fixed sinusoids (entries in [-1, 1]) do not drown the
# small initial word embeddings, which lets a model trained from scratch learn within a hundred steps.
TINY = ["--hidden_size", "64", "--num_hidden_layers", "2", "--num_attention_heads", "4", "--intermediate_size", "128",
        "--scale_embeddings", "--hidden_dropout_prob", "0", "--attention_probs_dropout_prob", "0",
        "--learning_rate", "2e-3", "--logging_steps", "5"]


def launch(script: str, *args, processes: int = 1):
    return launch_script(script, *args, processes=processes)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def check_saved_run(out, predictions_file: str):
    results = json.loads((out / "all_results.json").read_text())
    for name in ("README.md", "training_curves.png", "model.safetensors", "config.json", "tokenizer.json",
                 "metrics.jsonl", predictions_file):
        assert (out / name).is_file(), name
    check_model_card(out, results)
    return results


# ----- sequence classification -----


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    """3,000 training and 400 held-out review rows of the test corpus in SST-2's layout, and a 2,000-token tokenizer
    trained on the training rows."""
    folder = tmp_path_factory.mktemp("reviews")
    train, dev = corpus.reviews(3000, seed=1), corpus.reviews(400, seed=2)
    corpus.write_reviews_tsv(folder / "train.tsv", train)
    corpus.write_reviews_tsv(folder / "dev.tsv", dev)
    tokenizer = train_wordpiece([text for text, _ in train], vocab_size=2000, min_frequency=2)
    tokenizer.save_pretrained(folder / "tokenizer")
    return folder


@pytest.mark.slow
def test_classification_beats_the_majority_class_and_the_pipeline_agrees(reviews, tmp_path):
    out = tmp_path / "reviews"
    launch("finetune_classification", "--train_file", reviews / "train.tsv", "--validation_file", reviews / "dev.tsv",
           "--tokenizer_name", reviews / "tokenizer", *TINY, "--per_device_train_batch_size", 32,
           "--num_train_epochs", 2, "--output_dir", out)
    results = check_saved_run(out, "eval_predictions.jsonl")
    rows = read_jsonl(out / "eval_predictions.jsonl")
    # The majority label is 0.51 of these 400 rows. Two epochs (188 steps) reached accuracy 1.0 with each of the seeds
    # 42, 1, 2 and 3 (the corpus's reviews carry their label in their words), so 0.9 fails a run that learns markedly
    # slower as well as one that learns nothing.
    assert results["eval_accuracy"] > 0.9, results["eval_accuracy"]
    assert results["eval_accuracy"] == pytest.approx(sum(r["prediction"] == r["label"] for r in rows) / len(rows))
    assert set(results["eval_per_class"]) == {"0", "1"} and len(results["eval_confusion_matrix"]["matrix"]) == 2
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1"} and config["problem_type"] == "single_label_classification"
    assert config["classifier_pooling"] == "mean"  # the default from scratch
    classify = pipeline("text-classification", model=str(out))
    served = classify([row["text"] for row in rows[:12]])
    assert [s["label"] for s in served] == [row["prediction"] for row in rows[:12]]
    assert [s["score"] for s in served] == pytest.approx([row["score"] for row in rows[:12]], abs=1e-4)


def test_regression_learns_targets_of_any_units_and_serves_them(reviews, tmp_path):
    """Scores in the hundreds (100 for a negative review, 400 for a positive one, plus noise): the model trains on
    standardised targets and is saved mapping to the scores, so that the pipeline serves what evaluation predicted."""
    rng = random.Random(0)
    for name, rows in (("train", corpus.reviews(600, seed=1)), ("dev", corpus.reviews(100, seed=2))):
        (tmp_path / f"{name}.tsv").write_text("sentence\tscore\n" + "".join(
            f"{text}\t{100 + 300 * label + rng.uniform(-20, 20):.1f}\n" for text, label in rows))
    out = tmp_path / "scores"
    run_here("finetune_classification", "--train_file", tmp_path / "train.tsv", "--validation_file",
             tmp_path / "dev.tsv", "--tokenizer_name", reviews / "tokenizer", *TINY, "--max_train_steps", 100,
             "--output_dir", out)
    results = json.loads((out / "all_results.json").read_text())
    rows = read_jsonl(out / "eval_predictions.jsonl")
    # A standard deviation of about 150: a head left in raw units stays near 0 after 100 steps (MAE about 250).
    assert results["eval_mae"] < 40 and results["eval_pearson"] > 0.9, results
    served = pipeline("text-classification", model=str(out), function_to_apply="none")([r["text"] for r in rows])
    assert [s["score"] for s in served] == pytest.approx([r["prediction"] for r in rows], rel=1e-4)


@pytest.mark.parametrize("batching", ["--no_group_by_length", "--group_by_length"])
def test_fine_tuning_draws_a_new_order_each_epoch(reviews, tmp_path, batching):
    """Each epoch the same rows in another order: the shuffling loader's generator moves on, and the length-grouped
    sampler's order is a function of the seed and the epoch. A resumed run's epochs are checked by
    test_a_resumed_fine_tuning_run_ends_with_the_weights_of_an_uninterrupted_one."""
    out = tmp_path / "epochs"
    run_here("finetune_classification", "--train_file", reviews / "train.tsv", "--validation_file",
             reviews / "dev.tsv", "--tokenizer_name", reviews / "tokenizer", *TINY, "--max_train_samples", 64,
             "--max_eval_samples", 16, "--per_device_train_batch_size", 16, "--num_train_epochs", 2, "--trace_data",
             batching, "--output_dir", out)
    epochs = {0: [], 1: []}
    for row in read_jsonl(out / "data_trace_rank0.jsonl"):
        epochs[row["epoch"]] += map(tuple, row["input_ids"])
    assert len(epochs[0]) == 64 and sorted(epochs[0]) == sorted(epochs[1]) and epochs[0] != epochs[1]


# ----- NER -----


def conll_slice(source, sentences: int) -> str:
    """The first `sentences` sentences of a CoNLL file, as written there (blank line after each)."""
    blocks = source.read_text(encoding="utf-8").split("\n\n")
    return "\n\n".join(blocks[:sentences]) + "\n\n"


@pytest.fixture(scope="module")
def conll(tmp_path_factory):
    """1,500 training and 300 validation sentences of the test corpus in CoNLL-2003's layout (IOB2), and a cased
    tokenizer trained on the training sentences (capitals matter for names)."""
    folder = tmp_path_factory.mktemp("conll")
    corpus.write_conll(folder / "train.txt", corpus.ner_sentences(1500, seed=3))
    corpus.write_conll(folder / "valid.txt", corpus.ner_sentences(300, seed=4))
    sentences = [" ".join(line.split()[0] for line in block.splitlines() if line.strip())
                 for block in (folder / "train.txt").read_text().split("\n\n")]
    train_wordpiece(sentences, vocab_size=2000, min_frequency=2, lowercase=False).save_pretrained(folder / "tokenizer")
    return folder


def ner_arguments(conll, out):
    return ["--train_file", conll / "train.txt", "--validation_file", conll / "valid.txt",
            "--tokenizer_name", conll / "tokenizer", *TINY, "--output_dir", out]


@pytest.mark.slow
def test_ner_finds_entities_and_the_pipeline_agrees(conll, tmp_path):
    out = tmp_path / "ner"
    launch("finetune_ner", *ner_arguments(conll, out), "--per_device_train_batch_size", 16, "--num_train_epochs", 2)
    results = check_saved_run(out, "eval_predictions.jsonl")
    assert json.loads((out / "config.json").read_text())["letter_case"]  # the script's default
    assert json.loads((out / "tokenizer_config.json").read_text())["model_input_names"][-1] == "case_ids"
    rows = read_jsonl(out / "eval_predictions.jsonl")
    assert len(rows) == 300
    tags = [tag for row in rows for tag in row["labels"]]
    all_o = tags.count("O") / len(tags)  # 0.78: the accuracy of tagging every token O
    # Tagging everything O (or at random) finds no entity, F1 0; two epochs (188 steps) reached F1 0.998 to 1.0 and
    # token accuracy 1.0 with each of the seeds 42, 1, 2 and 3.
    assert results["eval_f1"] > 0.8, results["eval_f1"]
    assert results["eval_accuracy"] > all_o + 0.03, (results["eval_accuracy"], all_o)
    assert set(results["eval_per_type"]) == {"LOC", "MISC", "ORG", "PER"}
    rescored = compute_entities([row["predictions"] for row in rows], [row["labels"] for row in rows])
    assert rescored["overall_f1"] == pytest.approx(results["eval_f1"])
    assert_token_pipeline_agrees(out, rows[:10])


def assert_token_pipeline_agrees(out, rows):
    """The tagging pipeline, given a sentence's words, finds exactly the entities of the script's predictions."""
    tagger = pipeline("token-classification", model=str(out), pipeline_class=IOB2TaggingPipeline)
    for row in rows:
        (entities,) = tagger([row["tokens"]], is_split_into_words=True)  # a batch of one pre-split sentence
        served = [(entity["entity_group"], entity["start"], entity["end"]) for entity in entities]
        assert served == entity_spans(row["tokens"], row["predictions"]), row["tokens"]


@pytest.mark.slow
def test_ner_on_two_processes_trains_an_epoch_once_and_gathers_every_sentence_once_in_order(conll, tmp_path):
    out = tmp_path / "ner2"
    launch("finetune_ner", *ner_arguments(conll, out), "--per_device_train_batch_size", 8, "--num_train_epochs", 1,
           "--max_train_samples", 320, "--max_eval_samples", 45, "--per_device_eval_batch_size", 4,
           "--label_all_tokens", "--eval_steps", 5, "--load_best_model_at_end", processes=2)
    results = check_saved_run(out, "eval_predictions.jsonl")
    assert results["train_steps"] == 20  # 320 sentences in batches of 8 on each of 2 processes
    assert results["best_step"] in (5, 10, 15, 20)
    rows = read_jsonl(out / "eval_predictions.jsonl")
    # 45 sentences in batches of 4 over 2 processes: accelerate pads the last round with repeated sentences, which
    # must be dropped, and rows of different lengths from the two processes must come back whole and in order.
    blocks = (conll / "valid.txt").read_text().split("\n\n")[:45]
    assert [row["tokens"] for row in rows] == [[line.split()[0] for line in b.splitlines()] for b in blocks]
    assert all(len(row["predictions"]) == len(row["tokens"]) for row in rows)
    rescored = compute_entities([row["predictions"] for row in rows], [row["labels"] for row in rows])
    assert rescored["overall_f1"] == pytest.approx(results["eval_f1"])
    assert rescored["overall_accuracy"] == pytest.approx(results["eval_accuracy"])
    # Rows 0-3 were predicted by process 0, rows 4-7 by process 1: the saved folder serves both halves as predicted.
    # (Twenty steps learn too little to change a prediction between evaluations, so this run cannot tell the best
    # weights from the last; test_load_best_model_at_end_... checks that both processes keep the best.)
    assert_token_pipeline_agrees(out, rows[:8])


@pytest.mark.slow
def test_ner_with_document_context_scores_every_sentence_once_in_order_as_the_cram_scores_a_test_file(conll, tmp_path):
    out = tmp_path / "ner-context"
    launch("finetune_ner", *ner_arguments(conll, out), "--document_context", "--per_device_train_batch_size", 4,
           "--num_train_epochs", 3, "--max_eval_samples", 45, "--per_device_eval_batch_size", 2, processes=2)
    results = check_saved_run(out, "eval_predictions.jsonl")
    # 1,500 sentences of about 12 tokens fill about 160 rows of up to 128 tokens: some 20 steps an epoch, not 188.
    assert 40 <= results["train_steps"] <= 90, results["train_steps"]
    assert results["eval_f1"] > 0.5, results["eval_f1"]  # 0.72 to 0.94 with each of the seeds 42, 1, 2 and 3
    rows = read_jsonl(out / "eval_predictions.jsonl")
    blocks = (conll / "valid.txt").read_text().split("\n\n")[:45]
    sentences = [[line.split() for line in block.splitlines()] for block in blocks]
    # Rows of several sentences, in batches of 2 over 2 processes: each sentence comes back once, in file order.
    assert [row["tokens"] for row in rows] == [[word for word, *_ in s] for s in sentences]
    rescored = compute_entities([row["predictions"] for row in rows], [row["labels"] for row in rows])
    assert rescored["overall_f1"] == pytest.approx(results["eval_f1"])
    # The cram's test scoring, given the same sentences as a jsonl file, builds the same rows and finds the same F1.
    test_file = tmp_path / "valid.jsonl"
    test_file.write_text("".join(json.dumps({"tokens": row["tokens"], "ner_tags": row["labels"]}) + "\n"
                                 for row in rows))
    from recipes.demo_eval import evaluate_tagger, tagger_scores

    assert evaluate_tagger(out, test_file, 128, context=True)["f1"] == pytest.approx(results["eval_f1"])
    # Scoring a CoNLL file keeps its documents: no row runs across a -DOCSTART- line.
    marked = tmp_path / "marked.txt"
    marked.write_text("\n\n".join(blocks[:20]) + "\n\n-DOCSTART- -X- -X- O\n\n" + "\n\n".join(blocks[20:]) + "\n")
    places = tagger_scores(out, read_conll(str(marked), 0, -1), 128, context=True)["places"]
    assert {row for row, _ in places[:20]}.isdisjoint(row for row, _ in places[20:])


# ----- extractive QA -----

@pytest.fixture(scope="module")
def squad(tmp_path_factory):
    """The test corpus's QA sets in SQuAD v1.1 JSON (250 paragraphs, 1,000 questions, to train; 50 paragraphs, 200
    questions, to evaluate), and a tokenizer trained on the training contexts and questions."""
    folder = tmp_path_factory.mktemp("squad")
    train = corpus.write_squad(folder / "train.json", 250, seed=5)
    corpus.write_squad(folder / "eval.json", 50, seed=6)
    paragraphs = [p for article in train["data"] for p in article["paragraphs"]]
    texts = [p["context"] for p in paragraphs] + [q["question"] for p in paragraphs for q in p["qas"]]
    train_wordpiece(texts, vocab_size=3000, min_frequency=2).save_pretrained(folder / "tokenizer")
    return folder


@pytest.mark.slow
def test_qa_beats_the_first_words_of_the_context_and_the_pipeline_agrees(squad, tmp_path):
    out = tmp_path / "qa"
    windows = {"max_seq_len": 256, "doc_stride": 96, "max_answer_len": 30}
    launch("finetune_qa", "--train_file", squad / "train.json", "--validation_file", squad / "eval.json",
           "--tokenizer_name", squad / "tokenizer", *TINY, "--per_device_train_batch_size", 16, "--learning_rate", 1e-3,
           "--num_train_epochs", 3, "--max_seq_length", windows["max_seq_len"], "--doc_stride", windows["doc_stride"],
           "--max_answer_length", windows["max_answer_len"], "--output_dir", out)
    results = check_saved_run(out, "eval_predictions.json")
    assert json.loads((out / "config.json").read_text())["cross_segment_match"]  # the script's default
    predictions = json.loads((out / "eval_predictions.json").read_text())
    questions = read_squad_json(str(squad / "eval.json"))
    references = {q["id"]: q["answers"]["text"] for q in questions}
    assert set(predictions) == set(references) and len(references) == 200
    assert compute_squad(predictions, references)["f1"] == pytest.approx(results["eval_f1"])
    # The trivial baseline answers with the first k words of the context; its best k in 1..10 scores F1 about 6
    # here. Three epochs (189 steps) reached F1 47 to 55 with each of the seeds 42, 1, 2 and 3, by learning the kinds
    # of answer and where the question's words are.
    baseline = max(
        compute_squad({q["id"]: " ".join(q["context"].split()[:k]) for q in questions}, references)["f1"]
        for k in range(1, 11)
    )
    assert results["eval_f1"] > baseline + 25, (results["eval_f1"], baseline)
    nbest = json.loads((out / "eval_nbest_predictions.json").read_text())
    assert all(nbest[key][0]["answer"] == answer for key, answer in predictions.items())
    # One spelling for every environment, and no settings: the pipeline reads the run's windows from the config.
    assert json.loads((out / "config.json").read_text())["task_specific_params"]["question-answering"] == {
        **windows, "handle_impossible_answer": False}
    qa = pipeline("question-answering", model=str(out), trust_remote_code=True)
    for question in questions[:10]:
        served = qa(question=question["question"], context=question["context"])
        assert served["answer"] == predictions[question["id"]], question["id"]


def test_qa_marks_shared_tokens_qa_and_ner_read_letter_case_by_default_and_other_tasks_keep_the_checkpoints_choice():
    required = ["--output_dir", "out", "--train_file", "x.json"]
    qa = load_script("finetune_qa")
    assert qa.parse_args(required).cross_segment_match is True
    assert qa.parse_args([*required, "--no_cross_segment_match"]).cross_segment_match is False
    assert qa.parse_args(required).letter_case is True and qa.parse_args(required).train_answer_windows_only is False
    ner = load_script("finetune_ner")
    assert ner.parse_args(required).letter_case is True
    assert ner.parse_args([*required, "--no_letter_case"]).letter_case is False
    classification = load_script("finetune_classification")
    assert classification.parse_args(required).cross_segment_match is None  # as the checkpoint says
    assert classification.parse_args(required).letter_case is None
    assert classification.parse_args([*required, "--cross_segment_match"]).cross_segment_match is True


def test_a_checkpoint_that_reads_letter_case_needs_a_tokenizer_that_gives_it(tmp_path, capsys, tokenizer_dir,
                                                                             one_thread):
    from sinebert import SineBertConfig, SineBertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = SineBertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, letter_case=True)
    SineBertForSequenceClassification(config).save_pretrained(tmp_path / "cased")
    tokenizer.save_pretrained(tmp_path / "cased")  # a plain tokenizer: no case_ids
    data = tmp_path / "data.csv"
    data.write_text("sentence,label\n" + "".join(f"Text {i},{'ab'[i % 2]}\n" for i in range(8)))
    script = load_script("finetune_classification")
    argv = [str(a) for a in ["--train_file", data, "--validation_file", data, "--model_name_or_path",
                             tmp_path / "cased", "--max_train_steps", 1, "--per_device_train_batch_size", 4]]
    line = user_error(capsys, script, [*argv, "--output_dir", str(tmp_path / "a")])
    assert "The model reads letter case (letter_case in its config) but the tokenizer does not return case_ids" in line
    script.main([*argv, "--output_dir", str(tmp_path / "b"), "--letter_case"])
    assert json.loads((tmp_path / "b" / "tokenizer_config.json").read_text())["model_input_names"][-1] == "case_ids"
    script.main([*argv, "--output_dir", str(tmp_path / "c"), "--no_letter_case"])
    assert not json.loads((tmp_path / "c" / "config.json").read_text())["letter_case"]


# ----- one clear sentence for unusable data -----


def test_each_script_ends_bad_data_with_one_error_sentence(tmp_path, capsys, tokenizer_dir):
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\ngood,positive\nbad,negative\n")
    valid = tmp_path / "valid.csv"
    valid.write_text("sentence,label\nfine,positive\nmeh,neutral\n")
    common = ["--tokenizer_name", tokenizer_dir, *TINY]
    line = user_error(capsys, load_script("finetune_classification"),
                      ["--train_file", train, "--validation_file", valid, *common, "--output_dir", tmp_path / "c"])
    assert f"Row 2 of {valid} has the label 'neutral', which the training data never has" in line
    conll = tmp_path / "train.txt"
    conll.write_text("EU NNP B-NP B-ORG\nrejects VBZ O\n")
    line = user_error(capsys, load_script("finetune_ner"),
                      ["--train_file", conll, "--validation_file", conll, *common, "--output_dir", tmp_path / "n"])
    assert f"{conll} line 2 has 3 columns" in line
    squad = tmp_path / "squad.json"
    context = "It was written by Ada."
    squad.write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": "Who wrote it?", "answers": [{"text": "Ada", "answer_start": 3}]}]}]}]}))
    line = user_error(capsys, load_script("finetune_qa"),
                      ["--train_file", squad, "--validation_file", squad, *common, "--output_dir", tmp_path / "q"])
    assert "The answer 'Ada' of question 'q1' in the training data does not match its context" in line


# ----- exact resume -----


@pytest.fixture
def one_thread():
    """In-process runs on one thread, as the launched ones (restored afterwards for the other tests)."""
    with torch_threads(1):
        yield


def in_process_ner(conll, tmp_path, *common):
    """Runs finetune_ner in this process (no launcher), trained and scored on 60 CoNLL-2003 sentences, with a 1-layer
    model and `common` arguments; call the result with each run's own arguments."""
    small = tmp_path / "small.txt"
    small.write_text(conll_slice(conll / "train.txt", 60), encoding="utf-8")
    script = load_script("finetune_ner")
    tiny = ["--train_file", small, "--validation_file", small, "--tokenizer_name", conll / "tokenizer",
            "--hidden_size", 32, "--num_hidden_layers", 1, "--num_attention_heads", 2, "--intermediate_size", 64,
            "--per_device_train_batch_size", 8]
    return lambda *more: script.main([str(a) for a in [*tiny, *common, *more]])


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["--no_group_by_length", "--group_by_length"])
def test_a_resumed_fine_tuning_run_ends_with_the_weights_of_an_uninterrupted_one(conll, tmp_path, one_thread, batching):
    """In-process runs (no launcher): twelve steps straight, against one step, a checkpoint, then a resumed eleven
    that cross into the second epoch (8 batches of 60 sentences); with dropout on, so the per-step seeds and the data
    order (random or length-grouped batches, each epoch's) must all be restored."""
    run = in_process_ner(conll, tmp_path, "--max_eval_samples", 16, "--hidden_dropout_prob", 0.1,
                         "--max_train_steps", 12, "--checkpointing_steps", 3, batching)
    run("--output_dir", tmp_path / "straight")
    run("--output_dir", tmp_path / "resumed", "--max_train_minutes", 0)
    assert json.loads((tmp_path / "resumed" / "all_results.json").read_text())["train_steps"] == 1
    run("--output_dir", tmp_path / "resumed", "--resume_from_checkpoint", "latest")
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)
    assert (tmp_path / "straight" / "eval_predictions.jsonl").read_text() == \
        (tmp_path / "resumed" / "eval_predictions.jsonl").read_text()


@pytest.mark.slow
def test_epochs_given_with_a_time_budget_set_the_length_and_the_minutes_only_cap_it(conll, tmp_path, one_thread):
    run = in_process_ner(conll, tmp_path, "--max_eval_samples", 8)

    def steps(out):
        return json.loads((out / "all_results.json").read_text())["train_steps"]

    run("--output_dir", tmp_path / "epoch", "--num_train_epochs", 1)
    config = tmp_path / "recipe.yaml"  # as in a config file (the cram's), where it went unnoticed
    config.write_text("num_train_epochs: 1\nmax_train_minutes: 60\n")
    run("--output_dir", tmp_path / "capped", "--config_file", config)
    assert steps(tmp_path / "capped") == steps(tmp_path / "epoch") == 8  # 60 sentences in batches of 8


# ----- starting from a checkpoint -----


@pytest.mark.slow
def test_fine_tuning_starts_from_the_checkpoint_weights(tmp_path, capsys, tokenizer_dir, one_thread):
    """With learning rate 0 the saved encoder equals the checkpoint's; a checkpoint whose head has another number of
    labels needs --ignore_mismatched_sizes."""
    from sinebert import SineBertConfig, SineBertForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = SineBertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64)
    SineBertForMaskedLM(config).save_pretrained(tmp_path / "mlm")
    tokenizer.save_pretrained(tmp_path / "mlm")
    three, two = tmp_path / "three.csv", tmp_path / "two.csv"
    three.write_text("sentence,label\n" + "".join(f"text number {i},{'abc'[i % 3]}\n" for i in range(12)))
    two.write_text("sentence,label\n" + "".join(f"text {i},{'ab'[i % 2]}\n" for i in range(8)))
    script = load_script("finetune_classification")

    def argv(data, start, out, *more):
        return [str(a) for a in ["--train_file", data, "--validation_file", data, "--model_name_or_path", start,
                                 "--max_train_steps", 2, "--per_device_train_batch_size", 4, "--output_dir", out,
                                 *more]]

    script.main(argv(three, tmp_path / "mlm", tmp_path / "cls3", "--learning_rate", 0))
    start, tuned = load_file(tmp_path / "mlm" / "model.safetensors"), load_file(tmp_path / "cls3" / "model.safetensors")
    encoder = [name for name in start if name.startswith("sinebert.")]
    assert encoder and all(torch.equal(start[name], tuned[name]) for name in encoder)
    line = user_error(capsys, script, argv(two, tmp_path / "cls3", tmp_path / "cls2"))
    assert "(2 labels); pass --ignore_mismatched_sizes" in line
    script.main(argv(two, tmp_path / "cls3", tmp_path / "cls2b", "--ignore_mismatched_sizes"))
    assert json.loads((tmp_path / "cls2b" / "config.json").read_text())["id2label"] == {"0": "a", "1": "b"}


@pytest.mark.slow
def test_load_best_model_at_end_keeps_the_best_evaluation_weights_and_metrics_on_every_process(tmp_path, tokenizer_dir):
    """The validation rows are the training rows with their labels swapped, so the better the classifier fits its
    training rows the worse it scores: the best evaluation comes before the last, whatever the rounding. The kept
    weights must equal the checkpoint of the best step. Two processes, as `make demo` fine-tunes: each predicts half
    the validation rows, so a process that kept its last weights would write predictions the saved model does not
    make."""
    rows = [(f"the {word} of the nation {i}", label) for i in range(8) for word, label in (("peace", 0), ("war", 1))]
    for name, swap in (("train", 0), ("valid", 1)):
        (tmp_path / f"{name}.csv").write_text(
            "sentence,label\n" + "".join(f"{text},{'ab'[label ^ swap]}\n" for text, label in rows))

    def run(*more):
        launch("finetune_classification", "--train_file", tmp_path / "train.csv", "--validation_file",
               tmp_path / "valid.csv", "--tokenizer_name", tokenizer_dir, *TINY, "--classifier_pooling", "mean",
               "--adversarial_epsilon", 0, "--per_device_train_batch_size", 4, "--lr_scheduler_type", "constant",
               "--eval_steps", 2, *more, processes=2)

    run("--max_train_steps", 20, "--load_best_model_at_end", "--checkpointing_steps", 2,
        "--checkpoints_total_limit", 10, "--output_dir", tmp_path / "best")
    results = json.loads((tmp_path / "best" / "all_results.json").read_text())
    evaluations = [row for row in read_jsonl(tmp_path / "best" / "metrics.jsonl") if "eval_accuracy" in row]
    best = max(evaluations, key=lambda row: row["eval_accuracy"])  # the first of equals, as the trainer keeps it
    assert results["best_step"] == best["step"] and best["eval_accuracy"] > evaluations[-1]["eval_accuracy"]
    assert results["eval_accuracy"] == best["eval_accuracy"] and results["train_steps"] == 20
    assert not (tmp_path / "best" / "best_model.safetensors").exists()

    kept = load_file(tmp_path / "best" / "model.safetensors")
    at_best = load_file(tmp_path / "best" / "checkpoints" / f"step_{best['step']:08d}" / "model.safetensors")
    assert kept.keys() == at_best.keys() and all(torch.equal(kept[name], at_best[name]) for name in kept)
    rows = read_jsonl(tmp_path / "best" / "eval_predictions.jsonl")
    served = pipeline("text-classification", model=str(tmp_path / "best"))([row["text"] for row in rows])
    assert [s["label"] for s in served] == [row["prediction"] for row in rows]
    assert [s["score"] for s in served] == pytest.approx([row["score"] for row in rows], abs=1e-4)
