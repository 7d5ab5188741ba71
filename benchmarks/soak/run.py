"""Soak test of the experiment runner: faults everywhere, nothing lost, the same table.

Each round runs `refinery experiment` on three built-in CPU tasks against a scripted endpoint on
127.0.0.1 (benchmarks/soak/fake_server.py) that injects transport faults: 429 with Retry-After, 500, a
connection reset, a stall past the client timeout, a truncated body. The scripted replies mix
correct kernels with replies without code, garbage, and candidates that segfault, hang, exhaust
memory, write out of bounds, print megabytes, and fork (benchmarks/soak/kernels.cpp, one extension).
During the round the soak SIGKILLs evaluation workers, and SIGKILLs the experiment process once
and runs the same command again. The same script then runs without any fault into another run
directory, and the two tables must agree on their deterministic parts.

    python -m benchmarks.soak --short          # one small round (the tests run it)
    python -m benchmarks.soak --minutes 30     # rounds until 30 minutes are spent
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from benchmarks.soak import KERNELS_CPP
from benchmarks.soak.fake_server import FaultPlan, ServerLog, draft_tag, serve
from kernel_refinery.bench.experiment import ExperimentConfig, TrajectoryRecord, plan, read_result, read_results, results_path
from kernel_refinery.traces.schema import TrajectoryId

KERNELS = KERNELS_CPP.read_text()
FUNCTIONS = ["relu_slow", "crash", "spin", "hog", "oob_write", "chatty", "forker", "chain", "gelu_wrong"]
TASKS = {"1_relu": "level1/1_relu", "2_gelu": "level1/2_gelu", "9_bias_tanh_clamp_chain": "level2/9_bias_tanh_clamp_chain"}
TASK_FILTER = "[129]_[rgb]*"  # 1_relu, 2_gelu (level 1) and 9_bias_tanh_clamp_chain (level 2)
FAULT_CANDIDATES = ("crash", "spin", "hog", "oob_write")
CANDIDATE_KINDS = ("correct", "no_code", "garbage", "crash", "spin", "hog", "oob_write", "chatty", "forker")

HEADER = f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
{KERNELS}"""

ext = load_inline(
    name="refinery_soak_kernels",
    cpp_sources=cpp_source,
    functions={FUNCTIONS!r},
    extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)
'''

_PLAIN = """

class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return ext.{call}
"""

_CHAIN = """

class ModelNew(nn.Module):
    def __init__(self, channels, low, high):
        super().__init__()
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(channels, 1, 1))
        self.shift = nn.Parameter(0.1 * torch.randn(channels, 1, 1))
        self.low = low
        self.high = high

    def forward(self, x):
        return ext.chain(x, self.scale, self.shift, self.low, self.high)
"""

# What the correct kind is for each task, and what the table must say about it.
_CORRECT_CALL = {"1_relu": "relu_slow(x, 2)", "2_gelu": "gelu_wrong(x)", "9_bias_tanh_clamp_chain": None}


def fence(code: str) -> str:
    return f"Here is my kernel.\n```python\n{code}```\n"


def effective_kind(task: str, kind: str) -> str:
    # chatty and forker compute ReLU, so they only suit the ReLU task; elsewhere a crash stands in.
    return "crash" if kind in ("chatty", "forker") and task != "1_relu" else kind


def expected_status(task: str, kind: str) -> str:
    """The verdict the evaluator must give a candidate of this kind, with or without faults."""
    if kind == "correct":
        return "incorrect" if task == "2_gelu" else "correct"
    return EXPECTED_STATUS[effective_kind(task, kind)]


EXPECTED_STATUS = {
    "no_code": "no_code",
    "garbage": "no_code",
    "crash": "runtime_error",
    "spin": "timeout",
    "hog": "oom",
    "oob_write": "runtime_error",
    "chatty": "correct",
    "forker": "correct",
}


def reply(task: str, kind: str, rng: random.Random) -> str:
    """One scripted reply of the given kind for a task."""
    kind = effective_kind(task, kind)
    if kind == "no_code":
        return "I would fuse the loops and vectorise them, but I will not write the code yet."
    if kind == "garbage":
        junk = "".join(rng.choice("{}[]()<>;:=+-*/#@!~^%$ \nabcxyzModelNew") for _ in range(400))
        return f"```python\n{junk}\n```\n" + "".join(chr(rng.randrange(0x20, 0x2FF)) for _ in range(200))
    if kind == "correct":
        call = _CORRECT_CALL[task]
        return fence(HEADER + (_CHAIN if call is None else _PLAIN.format(call=call)))
    return fence(HEADER + _PLAIN.format(call=f"{kind}(x)"))


SHORT_SCRIPT = {
    "1_relu": ["crash", "chatty", "forker"],
    "2_gelu": ["no_code", "spin", "hog"],
    "9_bias_tanh_clamp_chain": ["garbage", "oob_write", "correct"],
}


def random_kinds(rng: random.Random, task: str, turns: int) -> list[str]:
    menu = ["correct", "no_code", "garbage", *FAULT_CANDIDATES]
    if task == "1_relu":
        menu += ["chatty", "forker"]
    # Hangs cost a whole timeout each: keep them rarer than the rest.
    weights = [3 if k == "correct" else 1 if k == "spin" else 2 for k in menu]
    return rng.choices(menu, weights=weights, k=turns)


def with_draft_tag(text: str, turn: int) -> str:
    """The reply, naming its turn where the next prompt quotes it: in the code, or in its first words."""
    fence_start = "```python\n"
    if fence_start in text:
        return text.replace(fence_start, f"{fence_start}# {draft_tag(turn)}\n", 1)
    return f"({draft_tag(turn)}) {text}"


def build_script(kinds: dict[str, list[str]], seed: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    return {task: [with_draft_tag(reply(task, k, rng), turn) for turn, k in enumerate(ks, 1)] for task, ks in kinds.items()}


@dataclass
class Settings:
    turns: int = 3
    samples: int = 1
    workers: int = 2
    concurrency: int = 6
    eval_timeout_s: float = 25.0
    llm_timeout_s: float = 5.0
    stall_s: float = 6.5
    fault_rate: float = 0.35
    worker_kill_every_s: tuple[float, float] = (15.0, 40.0)
    round_limit_s: float = 900.0


def experiment_toml(s: Settings, base_url: str, cache_dir: Path) -> str:
    return f"""
suite = "builtin"
levels = [1, 2]
tasks = "{TASK_FILTER}"
variants = ["G", "G+E"]
turns = {s.turns}
samples = {s.samples}
target_speedup = 1e9  # never met: every trajectory plays its whole script, whatever the timings
workers = {s.workers}
concurrency = {s.concurrency}
hardware_prompt = false

[llm]
model = "soak"
base_url = "{base_url}"
api_key_env = "REFINERY_SOAK_NO_KEY"
temperature = 0.7
timeout_s = {s.llm_timeout_s}
retries = 10
max_tokens = 4096

[eval]
trials = 5
warmup = 1
correctness_trials = 2
time_compiled_reference = false
timeout_s = {s.eval_timeout_s}
memory_limit_gb = 2.0
cache_dir = "{cache_dir}"
"""


def table(records: list[TrajectoryRecord]) -> list[tuple]:
    """The parts of the report the scripted outcomes fix. Speedups are measurements, not outcomes:
    the soak's fused kernel measured 0.86x to 1.9x from round to round on 2 busy cores, so fast_1
    is left out (fast_0 only asks for a correct, timed kernel)."""
    from kernel_refinery.bench.report import score

    return [(s.level, s.variant, s.tasks, s.correct, s.compiled, s.fast_p["0"]) for s in score(records)]


def outcomes(records: list[TrajectoryRecord]) -> dict[TrajectoryId, tuple]:
    """Each trajectory's turn statuses and best status."""
    return {r.id: (tuple(t.status for t in r.per_turn), r.best_status) for r in records}


@dataclass
class Totals:
    rounds: int = 0
    rounds_failed: int = 0
    trajectories: int = 0
    turns: int = 0
    requests: int = 0
    faults: Counter = field(default_factory=Counter)
    """Transport faults injected by the endpoint, by kind."""
    faults_survived: Counter = field(default_factory=Counter)
    """... in rounds where every invariant held (nothing lost or duplicated, the same table)."""
    failures: Counter = field(default_factory=Counter)
    """Failed rounds, by what failed: the phase and the exception the log ends with."""
    candidates: Counter = field(default_factory=Counter)
    """Candidate turns played in the faulty runs, by kind."""
    candidates_survived: Counter = field(default_factory=Counter)
    """... whose verdict was the expected one and the fault-free run's."""
    llm_retries: int = 0
    llm_retries_logged: int = 0
    worker_kills: int = 0
    worker_kills_survived: int = 0
    worker_starts: int = 0
    worker_restarts: int = 0
    outside_kills_retried: int = 0
    experiment_kills: int = 0
    experiment_kills_survived: int = 0
    lost: int = 0
    duplicated: int = 0
    tables_equal: int = 0
    tables_differ: int = 0
    outcomes_differ: int = 0
    stray_processes: int = 0

    def lines(self, elapsed_s: float) -> list[str]:
        transport = sum(self.faults.values())
        played = sum(self.candidates.values())
        return [
            f"rounds: {self.rounds} finished, {self.rounds_failed} failed (elapsed {elapsed_s / 60:.1f} min)"
            + (f"; failed rounds by cause: {dict(self.failures)}" if self.failures else ""),
            f"trajectories: {self.trajectories}",
            f"turns: {self.turns}",
            f"faults injected by kind: transport {dict(sorted(self.faults.items()))} (total {transport}, in {self.requests} LLM requests);"
            f" candidates {dict(sorted(self.candidates.items()))}; SIGKILLed workers {self.worker_kills};"
            f" SIGKILLed experiment processes {self.experiment_kills}",
            f"faults survived: transport {sum(self.faults_survived.values())} of {transport};"
            f" candidates {sum(self.candidates_survived.values())} of {played} (expected verdict, same as fault-free);"
            f" worker kills {self.worker_kills_survived} of {self.worker_kills};"
            f" experiment kills {self.experiment_kills_survived} of {self.experiment_kills}",
            f"worker restarts: {self.worker_restarts} (worker processes started: {self.worker_starts};"
            f" jobs retried after an outside kill: {self.outside_kills_retried})",
            f"retries made: {self.llm_retries} LLM retries seen by the endpoint ({self.llm_retries_logged} logged by the client)",
            f"trajectories lost: {self.lost}",
            f"duplicated trajectories after the resume: {self.duplicated}",
            f"stray processes after a round: {self.stray_processes}",
            f"final table equal to the fault-free table: {'yes' if self.tables_differ == 0 and self.tables_equal else 'no'}"
            f" ({self.tables_equal} of {self.tables_equal + self.tables_differ} rounds;"
            f" trajectory outcomes differ in {self.outcomes_differ})",
        ]

    def figures(self, minutes: float) -> dict[str, object]:
        return {
            "minutes": minutes,
            "rounds": self.rounds,
            "rounds_failed": self.rounds_failed,
            "trajectories": self.trajectories,
            "turns": self.turns,
            "requests": self.requests,
            "faults": dict(self.faults),
            "faults_survived": dict(self.faults_survived),
            "faults_not_survived": sum(self.faults.values()) - sum(self.faults_survived.values()),
            "failures": dict(self.failures),
            "candidates": dict(self.candidates),
            "candidates_survived": dict(self.candidates_survived),
            "worker_kills": self.worker_kills,
            "worker_kills_survived": self.worker_kills_survived,
            "experiment_kills": self.experiment_kills,
            "experiment_kills_survived": self.experiment_kills_survived,
            "worker_restarts": self.worker_restarts,
            "worker_starts": self.worker_starts,
            "outside_kills_retried": self.outside_kills_retried,
            "llm_retries": self.llm_retries,
            "llm_retries_logged": self.llm_retries_logged,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "tables_equal": self.tables_equal,
            "tables_differ": self.tables_differ,
            "outcomes_differ": self.outcomes_differ,
            "stray_processes": self.stray_processes,
        }


def refinery(*args: str) -> list[str]:
    return [sys.executable, "-c", "from kernel_refinery.bench.cli import app; app()", *args]


def _workers_of(proc: psutil.Process) -> list[psutil.Process]:
    found = []
    try:
        children = proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for child in children:
        try:
            # Forked from a template (tools/processes/forkserver.py), a runner keeps the template's command
            # line and names itself; started plainly (REFINERY_FORK_TEMPLATE=0), it is a child of ours.
            if child.name().startswith("refinery:worker") or (
                "kernel_refinery.tools.processes.worker_main" in child.cmdline() and child.ppid() == proc.pid
            ):
                found.append(child)
        except psutil.Error:
            pass
    return found


def _raw_keys(run_dir: Path) -> Counter:
    """Every record line of results.jsonl, duplicates kept (read_results collapses them)."""
    counts: Counter = Counter()
    path = results_path(run_dir)
    if not path.exists():
        return counts
    for line in path.read_text().splitlines():
        try:
            record = read_result(line)
        except ValueError:
            continue  # a torn line
        counts[record.id] += 1
    return counts


@dataclass
class Launch:
    rc: int | None
    worker_pids: set[int]
    worker_kills: int
    killed: bool


def supervise(
    cmd: list[str],
    run_dir: Path,
    log_path: Path,
    rng: random.Random,
    s: Settings,
    total: int,
    kill_experiment: bool,
    deadline: float,
    heartbeat: Callable[[int], None],
) -> Launch:
    """Run the experiment command; SIGKILL workers now and then, and the whole process once if asked."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    handle = psutil.Process(proc.pid)
    seen: dict[int, float] = {}
    immune: dict[int, float] = {}
    last_kill = -1e9
    kills = 0
    next_kill = time.monotonic() + rng.uniform(*s.worker_kill_every_s)
    kill_at = max(1, total // 3)
    killed = False
    next_beat = time.monotonic() + 60.0
    while proc.poll() is None:
        now = time.monotonic()
        if now >= next_beat:
            heartbeat(kills)
            next_beat = now + 60.0
        if now > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise TimeoutError(f"the experiment did not finish within the round's limit; see {log_path}")
        workers = _workers_of(handle)
        for w in workers:
            if w.pid not in seen:
                seen[w.pid] = now
                if now - last_kill < 20.0:
                    # Most likely the killed worker's replacement, retrying its job: the runner
                    # retries an outside kill once, so this one is left alone for a while.
                    immune[w.pid] = now + 180.0
        if now >= next_kill:
            old = [w for w in workers if now - seen[w.pid] > 5.0 and immune.get(w.pid, 0.0) < now]
            if old:
                victim = rng.choice(old)
                try:
                    victim.send_signal(signal.SIGKILL)
                    kills += 1
                    last_kill = now
                except psutil.NoSuchProcess:
                    pass
                next_kill = now + rng.uniform(*s.worker_kill_every_s)
        if kill_experiment and not killed and len(read_results(run_dir)) >= kill_at:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed = True
            break
        time.sleep(0.3)
    rc = proc.wait()
    return Launch(rc=None if killed else rc, worker_pids=set(seen), worker_kills=kills, killed=killed)


def _stray(pids: set[int]) -> list[psutil.Process]:
    """Processes of a finished round still alive: workers, or children a candidate left behind."""
    left = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


class RoundFailed(Exception):
    """A round that could not finish; `cause` names the phase and the error, for the figures."""

    def __init__(self, cause: str, detail: str = "") -> None:
        super().__init__(f"{cause}\n{detail}" if detail else cause)
        self.cause = cause


_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Exit|Interrupt|Failed)):?[ \t]*(.*)$", re.M)


def _cause(phase: str, log_path: Path) -> RoundFailed:
    """The failure of a run, named by the last exception its log shows (or its absence)."""
    tail = log_path.read_text(errors="replace")[-6000:] if log_path.exists() else ""
    found = _ERROR_LINE.findall(tail)
    error = f"{found[-1][0]}: {found[-1][1][:100]}" if found else "no exception in its log"
    return RoundFailed(f"{phase}: {error}", f"see {log_path}; its output ends:\n{tail[-2500:]}")


def clean_records(
    config_toml: str, script: dict[str, list[str]], run_dir: Path, log_path: Path, s: Settings, deadline: float
) -> list[TrajectoryRecord]:
    """The same script through a fault-free endpoint, uninterrupted."""
    server_log = ServerLog()
    with serve(script, server_log) as url:
        run_dir.mkdir(parents=True, exist_ok=True)
        config_path = run_dir.parent / f"{run_dir.name}.toml"
        config_path.write_text(config_toml.replace("@BASE_URL@", url))
        cmd = refinery("experiment", "--config", str(config_path), "--run-dir", str(run_dir))
        with log_path.open("ab") as out:
            proc = subprocess.run(
                cmd,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=max(10.0, deadline - time.monotonic()),
            )
        if proc.returncode != 0:
            raise _cause(f"fault-free run exited {proc.returncode}", log_path)
    return read_results(run_dir)


def run_round(
    index: int, seed: int, kinds: dict[str, list[str]], s: Settings, work: Path, cache_dir: Path, totals: Totals, say: Callable[[str], None]
) -> None:
    rng = random.Random(seed * 7919 + index)
    script = build_script(kinds, seed)
    round_dir = work / f"round-{index:03d}"
    round_dir.mkdir(parents=True, exist_ok=True)
    config_toml = experiment_toml(s, "@BASE_URL@", cache_dir)
    deadline = time.monotonic() + s.round_limit_s
    server_log = ServerLog()
    fault_plan = FaultPlan(seed=seed, rate=s.fault_rate, stall_s=s.stall_s)
    faulty_dir = round_dir / "faulty"
    log_path = round_dir / "faulty.log"
    say(f"round {index}: seed {seed}, script {kinds}")
    pids: set[int] = set()
    launches = 0
    kills_this_round = 0
    with serve(script, server_log, fault_plan) as url:
        config_path = round_dir / "faulty.toml"
        config_path.write_text(config_toml.replace("@BASE_URL@", url))
        config = ExperimentConfig.from_toml(config_path)
        total = len(plan(config))
        cmd = refinery("experiment", "--config", str(config_path), "--run-dir", str(faulty_dir))
        kill_experiment = True
        try:
            while True:
                launches += 1

                def beat(kills: int) -> None:
                    say(
                        f"round {index}: {len(read_results(faulty_dir))} of {total} trajectories done; "
                        f"{server_log.requests} LLM requests, faults {dict(server_log.faults)}, "
                        f"{totals.worker_kills + kills} workers SIGKILLed so far"
                    )

                try:
                    launch = supervise(cmd, faulty_dir, log_path, rng, s, total, kill_experiment, deadline, beat)
                except TimeoutError as exc:
                    raise RoundFailed("experiment under faults: past the round's limit", str(exc)) from exc
                pids |= launch.worker_pids
                totals.worker_kills += launch.worker_kills
                kills_this_round += launch.worker_kills
                if launch.killed:
                    totals.experiment_kills += 1
                    kill_experiment = False
                    say(
                        f"round {index}: experiment SIGKILLed with {len(read_results(faulty_dir))} of {total} trajectories done; restarting"
                    )
                    continue
                if launch.rc != 0:
                    raise _cause(f"experiment under faults exited {launch.rc}", log_path)
                break
        finally:
            # Faults injected count whatever became of the round.
            totals.requests += server_log.requests
            totals.faults.update(server_log.faults)
            totals.llm_retries += server_log.retries
    # The fault-free run comes after, never alongside: two runs sharing the cores changed timed
    # verdicts (a 7.6x kernel measured 0.78x next to a spinning candidate on its core).
    clean = clean_records(config_toml, script, round_dir / "clean", round_dir / "clean.log", s, deadline)
    text = log_path.read_text(errors="replace")
    totals.llm_retries_logged += text.count("llm_retry")
    totals.outside_kills_retried += text.count("worker_killed_retrying")
    totals.worker_starts += len(pids)
    totals.worker_restarts += max(0, len(pids) - s.workers * launches)

    raw = _raw_keys(faulty_dir)
    faulty = read_results(faulty_dir)
    planned = {planned.id for planned in plan(config)}
    lost = len(planned - set(raw))
    duplicated = sum(c - 1 for c in raw.values() if c > 1)
    totals.lost += lost
    totals.duplicated += duplicated
    totals.trajectories += len(faulty)
    totals.turns += sum(r.turns for r in faulty)

    same_table = table(faulty) == table(clean)
    if same_table:
        totals.tables_equal += 1
    else:
        totals.tables_differ += 1
        say(f"round {index}: TABLES DIFFER\n  faulty: {table(faulty)}\n  clean:  {table(clean)}")
    a, b = outcomes(faulty), outcomes(clean)
    differ = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    totals.outcomes_differ += len(differ)
    for k in differ:
        say(f"round {index}: outcome differs for {k}: faulty {a.get(k)} clean {b.get(k)}")
    clean_turns = {r.id: [t.status for t in r.per_turn] for r in clean}
    for r in faulty:
        name = r.task.rsplit("/", 1)[-1]
        for turn, outcome in enumerate(r.per_turn):
            status = outcome.status
            kind = effective_kind(name, kinds[name][min(turn, len(kinds[name]) - 1)])
            totals.candidates[kind] += 1
            again = clean_turns.get(r.id, [])
            if status == expected_status(name, kind) and turn < len(again) and again[turn] == status:
                totals.candidates_survived[kind] += 1
            else:
                say(f"round {index}: {r.id} turn {turn + 1} ({kind}): {status}, expected {expected_status(name, kind)}")
    if lost == 0 and duplicated == 0 and same_table and not differ:
        totals.faults_survived.update(server_log.faults)
        totals.worker_kills_survived += kills_this_round
        totals.experiment_kills_survived += launches - 1
    stray = _stray(pids)
    totals.stray_processes += len(stray)
    for p in stray:
        say(f"round {index}: stray process {p.pid} {' '.join(p.cmdline()[:4])}; ending it")
        with contextlib.suppress(psutil.Error):
            p.kill()
    totals.rounds += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--short", action="store_true", help="one small round covering every fault (the tests)")
    mode.add_argument("--minutes", type=float, help="run rounds until this many minutes are spent")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None, help="default: runs/soak-<time>")
    parser.add_argument("--figures", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--cache-dir", type=Path, default=None, help="build cache; default: WORK_DIR/cache")
    args = parser.parse_args(argv)

    work = (args.work_dir or Path("runs") / f"soak-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    cache_dir = (args.cache_dir or work / "cache").resolve()
    started = time.monotonic()
    totals = Totals()

    def say(text: str) -> None:
        print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)

    def report() -> None:
        for line in totals.lines(time.monotonic() - started):
            say("  " + line)

    s = Settings()
    say(f"work dir {work}")

    def play(index: int, seed: int, kinds: dict[str, list[str]]) -> None:
        try:
            run_round(index, seed, kinds, s, work, cache_dir, totals, say)
        except RoundFailed as exc:  # a failed round is a finding: say it, charge it to its cause, go on
            totals.rounds_failed += 1
            totals.failures[exc.cause] += 1
            say(f"round {index} FAILED: {exc}")
        except Exception as exc:  # noqa: BLE001 - the soak's own fault, still a finding
            totals.rounds_failed += 1
            totals.failures[f"soak: {type(exc).__name__}: {exc}"[:160]] += 1
            say(f"round {index} FAILED in the soak itself: {type(exc).__name__}: {exc}")

    if args.short:
        play(0, args.seed, SHORT_SCRIPT)
    else:
        end = started + args.minutes * 60
        index = 0
        # Rounds start until the time is spent, so the soak lasts at least --minutes.
        while time.monotonic() < end:
            rng = random.Random(args.seed * 1_000_003 + index)
            kinds = {task: random_kinds(rng, task, s.turns) for task in TASKS}
            play(index, args.seed + index, SHORT_SCRIPT if index == 0 else kinds)  # every kind in round 0
            say(f"running totals after round {index}:")
            report()
            index += 1
    say("figures:")
    report()
    figures = totals.figures((time.monotonic() - started) / 60)
    (args.figures or work / "figures.json").write_text(json.dumps(figures, indent=2))
    ok = totals.rounds_failed == 0 and totals.lost == 0 and totals.duplicated == 0 and totals.tables_differ == 0 and totals.tables_equal > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
