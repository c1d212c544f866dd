"""What the demo and the cram share: how the training scripts are launched on this machine, and the stage runner.

A recipe is a list of stages, each running a real script, or of stages that run side by side (`Together`: independent
runs that split a CPU's cores). A stage whose outputs are complete and whose command is unchanged is reused; an
interrupted training stage resumes from its last checkpoint. `stages.json` in the output folder keeps what ran, with
which command, and how long it took; `launch.json` keeps how the scripts are launched,
decided at the first start and reused by every rerun, so that a rerun never changes the work it reuses.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sinebert.training.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


# ----- the machine -----


@dataclass(frozen=True)
class Launch:
    """How the training scripts run: every GPU, or CPU processes that split the cores; bf16 or float32."""

    gpus: int
    processes: int
    threads: int  # CPU threads per process
    bf16: bool
    why: str = ""  # the reason for the precision, said at the first start

    def command(self, script: str) -> list[str]:
        """`accelerate launch scripts/<script>` with these settings."""
        command = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--dynamo_backend", "no",
                   "--num_processes", str(self.processes)]
        if self.processes > 1:
            # On CPU-only machines the scripts then run one gloo process per copy; a free port for each rendezvous,
            # so that parallel runs on one machine never collide.
            command += ["--multi_gpu", "--main_process_port", str(free_port())]
        if not self.gpus:
            command += ["--num_cpu_threads_per_process", str(self.threads)]
        return command + ["--mixed_precision", "bf16" if self.bf16 else "no", str(SCRIPTS / script)]

    def split(self, jobs: int) -> "Launch | None":
        """How each of `jobs` runs side by side launches on a CPU: one process with an equal share of the cores.
        None on GPUs (the runs take turns at every GPU) or with fewer cores than jobs."""
        cores = self.processes * self.threads
        if self.gpus or cores < jobs:
            return None
        return Launch(0, 1, cores // jobs, self.bf16, self.why)

    def env(self) -> dict:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        if not self.gpus:
            env["ACCELERATE_USE_CPU"] = "true"
        return env

    def describe(self) -> str:
        if self.gpus:
            return f"{self.processes} GPU process{'es' if self.processes > 1 else ''}" + (", bf16" if self.bf16 else "")
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}" + (" each" if self.processes > 1 else "")
        processes = f"{self.processes} CPU process{'es' if self.processes > 1 else ''}"
        return f"{processes}, {threads}" + (", bf16" if self.bf16 else "")


def decide_launch(processes: int | None = None, threads: int | None = None) -> Launch:
    """Every GPU; on a CPU, two data-parallel processes splitting the cores unless told otherwise (on the shared 2-core
    machine two single-threaded processes trained fastest: threads of one process wait for each other at every
    operation whenever another job holds a core). bf16 where the hardware multiplies it natively and fast."""
    import torch

    from sinebert.training.loop import bf16_matmuls_are_fast

    if processes is not None and processes < 1 or threads is not None and threads < 1:
        raise UserError(f"--num_processes and --threads must be at least 1, got {processes} and {threads}.")
    gpu = torch.cuda.is_available()
    # bf16 only where it runs at speed: a GPU before Ampere emulates it, and most CPUs run it slower than float32.
    bf16, why = bf16_matmuls_are_fast(torch.device("cuda" if gpu else "cpu"))
    if gpu:
        gpus = torch.cuda.device_count()
        return Launch(gpus, processes or gpus, 1, bf16, why)
    cores = os.cpu_count() or 1
    processes = processes or min(2, cores)
    return Launch(0, processes, threads or max(1, cores // processes), bf16, why)


def recorded_launch(root: Path, processes: int | None = None, threads: int | None = None) -> Launch:
    """The launch recorded in `root`/launch.json by the first start; decided (and recorded) where there is none, or
    where `processes` or `threads` ask for another. Says which, and why."""
    path = root / "launch.json"
    if path.is_file():
        launch = Launch(**json.loads(path.read_text()))
        if (processes or launch.processes) == launch.processes and (threads or launch.threads) == launch.threads:
            print(f"Launch as recorded at the first start in {_short(path)}: {launch.describe()} ({launch.why}).",
                  flush=True)
            return launch
    launch = decide_launch(processes, threads)
    root.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(launch), indent=1) + "\n")
    os.replace(temporary, path)
    precision = "" if launch.bf16 else ", float32"
    print(f"Launch: {launch.describe()}{precision} ({launch.why}); recorded in {_short(path)} for every rerun.",
          flush=True)
    return launch


def free_port() -> int:
    """A free local port for torch.distributed's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ----- stages -----


@dataclass
class Stage:
    """One step of the demo. `action` does the work; `signature` says what work (a rerun with another signature
    starts the stage over); `outputs` exist once it is complete; `needs` are stages whose rerun forces this one.
    `build`, when given, makes a script stage's command once the stages before it have run (it may read their
    outputs)."""

    name: str
    title: str
    action: Callable[["Stage", bool], None]  # (stage, resumed)
    signature: list[str]
    outputs: list[Path]
    needs: tuple[str, ...] = ()
    command: list[str] = field(default_factory=list)
    output_dir: Path | None = None
    resumable: bool = False
    always: bool = False  # cheap stages that run every time (the report)
    build: Callable[[], list[str]] | None = None
    live: bool = True  # its output shown as it comes (a stage run beside another writes only to its log)


@dataclass
class Together:
    """Stages that run side by side, each with its own share of the machine; the first one's output is shown."""

    stages: list[Stage]


def members(item: "Stage | Together") -> list[Stage]:
    return item.stages if isinstance(item, Together) else [item]


def stage_names(items: list["Stage | Together"]) -> list[str]:
    return [stage.name for item in items for stage in members(item)]


class Ledger:
    """stages.json: per stage its signature, whether it finished, its wall time and whether it resumed."""

    def __init__(self, path: Path):
        self.path = path
        self.entries = json.loads(path.read_text()) if path.is_file() else {}
        self.lock = threading.Lock()  # stages run side by side update it from their threads

    def is_done(self, stage: Stage) -> bool:
        entry = self.entries.get(stage.name, {})
        return entry.get("done", False) and entry.get("signature") == stage.signature and all(
            p.exists() for p in stage.outputs
        )

    def started_same(self, stage: Stage) -> bool:
        return self.entries.get(stage.name, {}).get("signature") == stage.signature

    def start(self, stage: Stage, together: list[str] = ()):
        """`together`: the names of the stages started side by side with it (itself included)."""
        entry = {"signature": stage.signature, "done": False}
        if len(together) > 1:
            entry["together"] = list(together)
        with self.lock:
            self.entries[stage.name] = entry
            self._save()

    def finish(self, stage: Stage, seconds: float, resumed: bool):
        with self.lock:
            self.entries[stage.name].update(done=True, seconds=round(seconds, 1), resumed=resumed,
                                            finished=time.strftime("%Y-%m-%d %H:%M:%S"))
            self._save()

    def wall_seconds(self, names: list[str] | None = None) -> float:
        """The time end to end of the stages `names` (default: all): stages that ran side by side count once, as the
        longest of them."""
        longest: dict[tuple[str, ...], float] = {}
        for name, entry in self.entries.items():
            if names is not None and name not in names:
                continue
            group = tuple(entry.get("together", [name]))
            longest[group] = max(longest.get(group, 0.0), entry.get("seconds", 0.0))
        return sum(longest.values())

    def outdated(self, stage: Stage) -> bool:
        """Whether a finished stage is older than a stage it needs: a run stopped after rerunning the one and before
        the other. A stage kept on purpose (`Runner.run(keep=...)`) is not outdated."""
        entry = self.entries.get(stage.name, {})
        if "finished" not in entry or entry.get("kept"):
            return False
        return any(self.entries.get(name, {}).get("finished", "") > entry["finished"] for name in stage.needs)

    def mark_kept(self, stage: Stage):
        self.entries[stage.name]["kept"] = True
        self._save()

    def seconds(self, name: str) -> float | None:
        return self.entries.get(name, {}).get("seconds")

    def _save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.entries, indent=1) + "\n")
        os.replace(temporary, self.path)


def has_checkpoint(output_dir: Path) -> bool:
    folder = output_dir / "checkpoints"
    return folder.is_dir() and any(p.name.startswith("step_") for p in folder.iterdir())


def run_logged(command: list[str], log_path: Path, env: dict, live: bool = True) -> int:
    """Run `command`, appending its output to `log_path` and, when `live`, showing it as it comes (progress bars
    included)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(command)}\n".encode())
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        try:
            for chunk in iter(lambda: process.stdout.read1(65536), b""):
                if live:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
                log.write(chunk)
            return process.wait()
        except BaseException:  # Ctrl-C or an error here: stop the stage too (its checkpoints stay for the resume)
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
            raise


class Runner:
    """Runs the stages in order, reusing finished ones and resuming interrupted training."""

    def __init__(self, root: Path, launch: "Launch"):
        self.logs, self.launch = root / "logs", launch
        self.ledger = Ledger(root / "stages.json")
        self.env = launch.env()
        self.started = time.perf_counter()

    def run(self, stages: list["Stage | Together"], keep: frozenset[str] = frozenset()):
        """`keep`: finished stages to reuse even when a stage they need reran (the user knows what they read is
        unchanged); the ledger marks them."""
        rerun: set[str] = set()
        count, index = sum(len(members(item)) for item in stages), 0
        for item in stages:
            due = []  # (stage, forced) of this item that have to run
            for stage in members(item):
                index += 1
                forced = self.ledger.outdated(stage) or any(name in rerun for name in stage.needs)
                if forced and stage.name in keep and self.ledger.is_done(stage):
                    forced = False
                    self.ledger.mark_kept(stage)
                if stage.build is not None:
                    stage.command = stage.build()
                    stage.signature = signature(stage.command)
                elapsed = _duration(time.perf_counter() - self.started)
                print(f"\n{'=' * 100}\n[{index}/{count}] {stage.title}   (time so far {elapsed})\n{'=' * 100}",
                      flush=True)
                if not forced and not stage.always and self.ledger.is_done(stage):
                    print(f"Reusing the finished stage (outputs in {_short(stage.outputs[0])}).", flush=True)
                    continue
                due.append((stage, forced))
            self._run_side_by_side(due)
            rerun.update(stage.name for stage, _ in due)

    def _run_side_by_side(self, due: list[tuple[Stage, bool]]):
        """Run the stages at once, each in a thread that waits on its script; the first one's output is shown, the
        others' go to their logs. An error is raised once every stage has ended, so no run is cut short."""
        together = [stage.name for stage, _ in due]
        if len(due) < 2:  # a lone stage runs here, so that Ctrl-C stops its script at once (`run_logged`)
            for stage, forced in due:
                self._run_stage(stage, forced, together)
            return
        for stage, _ in due[1:]:
            stage.live = False
            print(f"'{stage.name}' runs beside '{due[0][0].name}'; its output goes to "
                  f"{_short(self.logs / f'{stage.name}.log')}.", flush=True)
        with ThreadPoolExecutor(len(due)) as pool:
            futures = [pool.submit(self._run_stage, stage, forced, together) for stage, forced in due]
        for future in futures:
            future.result()

    def _run_stage(self, stage: Stage, forced: bool, together: list[str]):
        resumed = False
        if stage.output_dir is not None:
            resumed = stage.resumable and not forced and self.ledger.started_same(stage) and has_checkpoint(
                stage.output_dir)
            if not resumed and stage.output_dir.exists():
                shutil.rmtree(stage.output_dir)  # a different or unfinished run without a checkpoint: start over
            if resumed:
                print(f"Resuming {stage.name} from the last checkpoint in {_short(stage.output_dir)}.", flush=True)
        self.ledger.start(stage, together)
        start = time.perf_counter()
        stage.action(stage, resumed)
        self.ledger.finish(stage, time.perf_counter() - start, resumed)
        if not stage.live:
            print(f"\n'{stage.name}' finished in {_duration(time.perf_counter() - start)}.", flush=True)

    def script(self, stage: Stage, resumed: bool = False):
        """The action of a script stage: run its command (resuming when asked) and fail with one sentence."""
        command = stage.command + (["--resume_from_checkpoint", "latest"] if resumed else [])
        log = self.logs / f"{stage.name}.log"
        status = run_logged(command, log, self.env, stage.live)
        if status != 0:
            raise UserError(
                f"The stage '{stage.title}' failed with exit status {status}; its output is above and in "
                f"{_short(log)}{'; run the same command again to resume it' if stage.resumable else ''}."
            )


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


def _short(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)



def script_stage(runner: Runner, name: str, title: str, output: Path, command: list[str], needs=(),
                  outputs=None, resumable=False, keep_dir=False, build=None) -> Stage:
    return Stage(name, title, runner.script, signature=signature(command),
                 outputs=outputs or [output / "all_results.json"], needs=needs, command=command,
                 output_dir=None if keep_dir else output, resumable=resumable, build=build)


def signature(command: list[str]) -> list[str]:
    """The command without what changes from run to run but not the work: the rendezvous port."""
    return ["*" if i and command[i - 1] == "--main_process_port" else part for i, part in enumerate(command)]



STARTS = ("pretrained", "scratch")  # where a recipe's fine-tuning runs start: `start_args`


def finetune_launch(launch: Launch) -> Launch:
    """How each fine-tuning run of a recipe launches. On a CPU the runs from the checkpoint and from random weights go
    side by side, one process each: these small models spend much of a data-parallel step waiting for the other
    process (200 steps of the classifier: 30 s for 2 processes of 16 rows, 35 s for each of two single-process runs of
    32 side by side), so a pair takes about 40% less time. On GPUs (and on one core) they take turns with `launch`."""
    return launch.split(len(STARTS)) or launch


def start_args(start: str, checkpoint: Path) -> list[str]:
    """Where a fine-tuning run starts: "pretrained" from `checkpoint`; "scratch" from random weights with the
    checkpoint's architecture and tokenizer and the standard initialisation, whatever the pretraining's (from random
    weights it fine-tunes better than the mimetic one the demo pretrains from: docs/QUALITY.md)."""
    if start == "pretrained":
        return ["--model_name_or_path", str(checkpoint)]
    return ["--config_name", str(checkpoint), "--tokenizer_name", str(checkpoint), "--attention_init", "normal"]


