"""Shared fixtures: a tiny config, the committed test corpus (tests/fixtures), a tokenizer trained on its text, and a
guard that fails any test that opens a network connection. Nothing here needs ../shared: the suite runs anywhere."""

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.stages import free_port

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every subprocess (scripts, accelerate launch) gets the same network guard through sitecustomize.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT / "tests" / "network_guard"), str(ROOT), os.environ.get("PYTHONPATH")) if p
)


def accelerate_command(script: str, processes: int = 1, threads: int = 1, config: str | None = None) -> list[str]:
    """`accelerate launch <script>` on 1 or more CPU processes of `threads` threads, as
    configs/accelerate/cpu_2proc.yaml launches two, or with configs/accelerate/`config` (its process count and
    precision overridden).

    One thread per process by default: on a busy 2-core machine more threads than cores make every step many times
    slower.
    """
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no", "--num_cpu_threads_per_process", str(threads)]
    if config:
        launcher += ["--config_file", str(ROOT / "configs" / "accelerate" / config), "--num_processes", str(processes)]
    else:
        launcher += ["--num_processes", "1"] if processes == 1 else ["--multi_gpu", "--num_processes", str(processes)]
    if processes > 1:  # a port of its own: accelerate's default 29500 would clash with a launch running beside it
        launcher += ["--main_process_port", str(free_port())]
    return [*launcher, script]


def launch_script(name: str, *args, processes: int = 1, threads: int = 1, timeout: int = 600, config: str | None = None):
    """Run scripts/<name>.py through `accelerate launch` on the CPU; asserts that it succeeds."""
    command = accelerate_command(str(ROOT / "scripts" / f"{name}.py"), processes, threads, config)
    result = subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "ACCELERATE_USE_CPU": "true"}, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
# torch threads for a test's own work and its one-process runs: its pytest-xdist worker's share of the cores. Threads
# beyond that spin while another worker holds a core: two workers on 2 cores, each on 2 threads, made a benchmark's
# test 8x slower than each on 1.
THREADS = max(1, CORES // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def pytest_xdist_auto_num_workers(config) -> int:
    """`pytest -n auto` (make test): one worker per two cores, as most end-to-end tests launch two processes; at
    least two, since one process importing torch, most of a launch, leaves a core idle."""
    return max(2, CORES // 2)


def pytest_configure(config):
    """This process's torch on THREADS (each worker's, and a serial run's)."""
    import torch

    torch.set_num_threads(THREADS)


@contextlib.contextmanager
def torch_threads(count: int):
    """torch on `count` threads inside the block, as `accelerate launch --num_cpu_threads_per_process` runs one."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def run_here(name: str, *args, threads: int = THREADS):
    """scripts/<name>.py's main in this process on `threads` threads, as `launch_script` runs one process: for the runs
    whose subject is not the launch. (A launch spends about 12 of its 15 s importing torch and transformers.)"""
    with torch_threads(threads):
        load_script(name).main([str(a) for a in args])


@pytest.fixture(autouse=True, scope="session")
def no_network():
    """Nothing in the suite may reach the internet; loopback (torch.distributed's gloo) stays allowed."""
    import importlib.util

    path = ROOT / "tests" / "network_guard" / "sitecustomize.py"  # also loaded by every subprocess
    spec = importlib.util.spec_from_file_location("sinebert_network_guard", path)
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    assert socket.socket.connect is guard._guarded_connect


def auto_heads() -> list[tuple[type, type]]:
    """Each of transformers' Auto classes that serve sinebert, with the sinebert class it loads."""
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForQuestionAnswering
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    from sinebert import (SineBertForMaskedLM, SineBertForQuestionAnswering, SineBertForSequenceClassification,
                          SineBertForTokenClassification, SineBertModel)

    return [(AutoModel, SineBertModel), (AutoModelForMaskedLM, SineBertForMaskedLM),
            (AutoModelForSequenceClassification, SineBertForSequenceClassification),
            (AutoModelForTokenClassification, SineBertForTokenClassification),
            (AutoModelForQuestionAnswering, SineBertForQuestionAnswering)]


def tiny_config(**overrides):
    from sinebert import SineBertConfig

    values = dict(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    values.update(overrides)
    return SineBertConfig(**values)


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    """3,400 real sentences (State of the Union addresses, tests/fixtures/sotu.txt)."""
    from tests.fixtures import corpus

    return corpus.sentences()


@pytest.fixture(scope="session")
def text_corpus(tmp_path_factory, sentences) -> Path:
    """train.txt (3,000 of the sentences) and valid.txt (400 more), one text per line."""
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "train.txt").write_text("\n".join(sentences[:3000]) + "\n", encoding="utf-8")
    (folder / "valid.txt").write_text("\n".join(sentences[3000:3400]) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, sentences) -> Path:
    """A WordPiece tokenizer of 600 tokens trained on the real sentences, saved like the training script does."""
    from sinebert.training.tokenizer import train_wordpiece

    path = tmp_path_factory.mktemp("tokenizer")
    train_wordpiece(sentences, vocab_size=600, min_frequency=2).save_pretrained(path)
    return path


def load_script(name: str):
    """Import scripts/<name>.py as a module, to call its `main(argv)` in-process (faster than a subprocess)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_model_card(out, results: dict):
    """The card's metadata is what the hub reads; its scores are the run's; args.json holds every argument."""
    import json

    from huggingface_hub import ModelCard

    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers" and "sinebert" in card.data.tags
    scores = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert scores and all(scores[key] == pytest.approx(results[key], rel=1e-5) for key in scores), scores
    assert "trust_remote_code=True" in card.text and str(out.parent) not in card.content  # no absolute paths
    assert json.loads((out / "args.json").read_text())["output_dir"] == str(out)


def user_error(capsys, script, argv) -> str:
    """Run a script's main through its CLI wrapper and return the one error line it prints (exit status 2)."""
    from sinebert.training.errors import run_cli

    with pytest.raises(SystemExit) as exit_info:
        run_cli(lambda: script.main([str(a) for a in argv]))
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, lines
    return lines[0]


def classifier_step_setup():
    """A tiny classifier at a fixed seed, a copy with the same weights (the reference a test computes by hand), four
    rows of 3 to 7 tokens and those rows collated into one padded batch: one Trainer step's worth."""
    import torch

    from sinebert import SineBertForSequenceClassification
    from sinebert.training.finetune import PaddingCollator

    torch.manual_seed(0)
    model = SineBertForSequenceClassification(tiny_config(num_labels=2))
    reference = SineBertForSequenceClassification(tiny_config(num_labels=2))
    reference.load_state_dict(model.state_dict())
    rows = [{"input_ids": list(range(5, 5 + n)), "attention_mask": [1] * n, "labels": n % 2} for n in (3, 7, 5, 6)]
    return model, reference, rows, PaddingCollator(0)(rows)


def classifier_trainer(args, accelerator, model, rows):
    """The Trainer of the classification script over `rows` (one batch of all four), its schedule fitted as the
    script fits it."""
    import torch

    from sinebert.training.classification import example_count
    from sinebert.training.finetune import PaddingCollator, fit_schedule
    from sinebert.training.loop import Task, Trainer

    loader = torch.utils.data.DataLoader(rows, batch_size=4, collate_fn=PaddingCollator(0))
    fit_schedule(args, accelerator, len(rows))
    return Trainer(args, accelerator, model, loader, Task(count=example_count))


def gradients_at_optimizer_step(trainer, model, batch) -> dict:
    """The gradients one `_optimizer_step` of `trainer` on `batch` hands the optimizer (whose step is replaced)."""
    import time
    import warnings

    seen = {}
    trainer.optimizer.step = lambda: seen.update(
        {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    with warnings.catch_warnings():  # the scheduler cannot tell that the replaced step ran
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)`")
        trainer._optimizer_step([batch], time.perf_counter())
    return seen


def entity_spans(words: list[str], tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, start, end) of each entity of well-formed IOB2 `tags`, in characters of the words joined by spaces: what
    the token-classification pipeline reports for words given split."""
    spans, start = [], 0
    for word, tag in zip(words, tags):
        if tag.startswith("B-"):
            spans.append((tag[2:], start, start + len(word)))
        elif tag.startswith("I-"):
            spans[-1] = (spans[-1][0], spans[-1][1], start + len(word))
        start += len(word) + 1
    return spans
