"""configs/accelerate/*.yaml resolve as written through accelerate's own launch parsing (a dry run: the environment
each process would get, without starting one), and the README's multi-GPU command is one of them."""

import re
import shlex

import pytest
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import prepare_multi_gpu_env

import sinebert.modeling_sinebert
from sinebert.training.loop import cpu_processes_line
from tests.conftest import ROOT

CONFIGS = ROOT / "configs" / "accelerate"
EXPECTED = {  # file: (multi_gpu, fsdp, processes, machines, mixed precision)
    "cpu.yaml": (False, False, 1, 1, "no"),
    "cpu_2proc.yaml": (True, False, 2, 1, "no"),
    "multi_gpu.yaml": (True, False, 8, 1, "bf16"),
    "fsdp.yaml": (False, True, 8, 1, "bf16"),
    "multi_node.yaml": (True, False, 16, 2, "bf16"),
}


def dry_run(arguments: list[str]):
    args = launch_command_parser().parse_args(arguments)
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args) if args.multi_gpu or args.use_fsdp else {}
    return args, env


def test_every_config_is_tested():
    assert sorted(path.name for path in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_config_resolves_as_written(name):
    args, env = dry_run(["--config_file", str(CONFIGS / name), "scripts/pretrain.py"])
    assert (bool(args.multi_gpu), bool(args.use_fsdp), args.num_processes, args.num_machines,
            args.mixed_precision) == EXPECTED[name]
    if args.use_fsdp:  # FSDP 2, one unit per layer: the class it names exists
        assert env["FSDP_VERSION"] == "2" and env["ACCELERATE_USE_FSDP"] == "true"
        assert hasattr(sinebert.modeling_sinebert, env["FSDP_TRANSFORMER_CLS_TO_WRAP"])
    if args.num_machines > 1:
        assert args.main_process_port and args.main_process_ip and args.rdzv_backend == "static"


def test_cpu_processes_get_one_thread_unless_told_and_the_scripts_say_how_to_use_the_idle_cores(monkeypatch):
    """accelerate starts each process of the 2-process CPU config with OMP_NUM_THREADS=1; on a machine of more cores
    the scripts' first line names the flag that uses them, whose value reaches the processes."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    two = ["--config_file", str(CONFIGS / "cpu_2proc.yaml")]
    assert dry_run([*two, "scripts/pretrain.py"])[1]["OMP_NUM_THREADS"] == "1"
    line = cpu_processes_line(processes=2, sharded=False, local=2, threads=1, cores=16)
    assert line.endswith("1 thread each. That keeps 2 of this machine's 16 cores busy; to use them all, pass "
                         "--num_cpu_threads_per_process 8 to accelerate launch (or set OMP_NUM_THREADS).")
    hint = line.split("pass ")[1].split(" to accelerate")[0].split()
    assert dry_run([*two, *hint, "scripts/pretrain.py"])[1]["OMP_NUM_THREADS"] == "8"
    assert cpu_processes_line(2, False, 2, 1, 2) == ("No GPU found: running 2 processes on the CPU (gloo), 1 thread "
                                                     "each.")
    assert cpu_processes_line(1, False, 1, 2, 2) == "No GPU found: running on the CPU, 2 threads."
    assert "--num_cpu_threads_per_process 4 " in cpu_processes_line(4, True, 2, 1, 8)  # 2 of 4 on this machine


def test_the_readme_multi_gpu_command_resolves_to_every_gpu_of_a_machine():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (line,) = [line for line in readme.replace("\\\n", " ").splitlines() if "configs/accelerate/multi_gpu.yaml" in line
               and line.lstrip().startswith(".venv/bin/accelerate launch")]
    words = shlex.split(line.split("  #")[0])
    arguments = words[words.index("launch") + 1 :]
    arguments = arguments[: arguments.index("scripts/pretrain.py") + 1]
    args, env = dry_run(arguments)
    assert args.multi_gpu and args.num_processes == int(re.search(r"--num_processes (\d+)", line).group(1))
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("ACCELERATE_USE_FSDP", "true", "The launch config asks for FSDP, which shards the model across processes, but "
                                    "this launch has one process"),
    ("FSDP_VERSION", "1", "The launch config asks for FSDP version 1, which accelerate runs on GPUs only"),
    ("MASTER_ADDR", "FIRST_MACHINE_ADDRESS", "main_process_ip is still FIRST_MACHINE_ADDRESS"),
])
def test_configs_that_cannot_run_here_are_one_sentence_before_anything_starts(tmp_path, capsys, monkeypatch, variable,
                                                                              value, message):
    """What `accelerate launch` sets for fsdp.yaml on a machine without a GPU, and for multi_node.yaml as shipped."""
    from tests.conftest import load_script, user_error

    monkeypatch.setenv(variable, value)
    if variable == "FSDP_VERSION":  # fsdp.yaml edited to FSDP 1, launched on two processes
        monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
        monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["--train_file", tmp_path / "x.txt", "--output_dir", tmp_path / "out"]
    assert message in user_error(capsys, load_script("pretrain"), argv)
    assert not (tmp_path / "out").exists()
