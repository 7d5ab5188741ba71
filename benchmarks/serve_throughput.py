"""The service against the pool it fronts: candidates per hour through `refinery serve` from many
concurrent clients, and through the throughput benchmark's own pool, measured in one command.

    python -m benchmarks.serve_throughput --clients 16 --workers 16 --json results/serve_throughput_h200.json
    python -m benchmarks.serve_throughput --device cpu --manifest FILE --workers 2 --clients 4   # CPU: the plumbing

Both sides get the same candidates (the throughput benchmark's manifest.toml: KernelBench tasks with
CUDA candidates, each with the verdict it should get), the same evaluator settings (EvalConfig's
defaults on the device, without the torch.compile baseline, as `benchmarks.throughput` has them), the
same number of workers, and a cold build cache each.

- service: `refinery serve --workers N --queue-size Q`, started first (its start-up is reported, not
  counted); then the clients take candidates from one shared list, so that each is evaluated once,
  through POST /evaluate. A 429 (queue full) is retried after 0.5 s.
- pool: `benchmarks.throughput.ours.run_ours`, the throughput benchmark's own side.

Candidates per hour = candidates / wall seconds × 3600; the service's wall time runs from the first
request to the last answer. The run fails (exit 1) if a candidate got no answer or more than one
through the service, or a verdict other than the one the pool gave it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.serve_process import running_server
from benchmarks.throughput.manifest import MANIFEST, Work, load, select
from benchmarks.throughput.ours import run_ours, verdict
from kernel_refinery.bench.serve.client import Client, ServiceError
from kernel_refinery.tools.config import EvalConfig

REQUEST: dict[str, Any] = {"time_compiled_reference": False}
"""What each request sets (with --trials, the timed calls too): the rest are the server's EvalConfig
defaults, as the pool's are."""


@dataclass(frozen=True)
class SideFigures:
    side: str
    candidates: int
    wall_s: float
    per_hour: float
    verdicts: dict[str, int]
    as_expected: int
    start_s: float = 0.0
    """The service's start-up (launch to /health), not in wall_s."""
    retries_429: int = 0


def _per_hour(n: int, wall_s: float) -> float:
    return 3600.0 * n / wall_s if wall_s > 0 else 0.0


def run_service(
    work: list[Work], expected: dict[str, str], clients: int, workers: int, queue_size: int, device: str, cache_dir: Path
) -> tuple[SideFigures, dict[str, list[str]]]:
    """Every candidate once through a fresh `refinery serve`; its figures and each candidate's answers."""
    pending = list(reversed(work))
    answers: dict[str, list[str]] = {item.candidate: [] for item in work}
    lock = threading.Lock()
    retries = 0

    def client_loop(url: str, token: str) -> None:
        nonlocal retries
        with Client(url, token, timeout_s=1900) as client:
            while True:
                with lock:
                    if not pending:
                        return
                    item = pending.pop()
                while True:
                    try:
                        result = client.evaluate(item.task_source, item.kernel_source, task_name=item.task, **REQUEST)
                        answer = verdict(result.status)
                    except ServiceError as exc:
                        if exc.status == 429:
                            with lock:
                                retries += 1
                            time.sleep(0.5)
                            continue
                        answer = f"http_{exc.status}"
                    except Exception as exc:  # noqa: BLE001 - a benchmark counts a failed request rather than dying on it
                        answer = f"client_error: {type(exc).__name__}"
                    break
                with lock:
                    answers[item.candidate].append(answer)

    with running_server(workers, queue_size, device, env={"REFINERY_CACHE_DIR": str(cache_dir)}) as server:
        started = time.monotonic()
        threads = [threading.Thread(target=client_loop, args=(server.url, server.token)) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
    firsts = {name: got[0] for name, got in answers.items() if got}
    figures = SideFigures(
        side=f"refinery serve, {clients} clients",
        candidates=len(work),
        wall_s=wall,
        per_hour=_per_hour(len(work), wall),
        verdicts=dict(Counter(firsts.values())),
        as_expected=sum(1 for name, got in firsts.items() if got == expected[name]),
        start_s=server.start_s,
        retries_429=retries,
    )
    return figures, answers


def run_pool(work: list[Work], expected: dict[str, str], workers: int, device: str, cache_dir: Path) -> tuple[SideFigures, dict[str, str]]:
    config = EvalConfig(device=device, cache_dir=cache_dir, **REQUEST)
    # On CPU the pool splits the cores between its workers as the server's does (devices=None).
    run = run_ours(work, workers, cache_dir, config=config, devices=1 if device == "cuda" else None)
    got = {name: str(r["verdict"]) for name, r in run.results.items()}
    figures = SideFigures(
        side="EvaluatorPool (benchmarks.throughput)",
        candidates=len(work),
        wall_s=run.wall_s,
        per_hour=_per_hour(len(work), run.wall_s),
        verdicts=dict(Counter(got.values())),
        as_expected=sum(1 for name, v in got.items() if v == expected[name]),
    )
    return figures, got


def disagreements(service: dict[str, list[str]], pool: dict[str, str]) -> list[str]:
    """Each candidate answered other than once through the service, or otherwise than by the pool."""
    problems = []
    for name, got in service.items():
        if len(got) != 1:
            problems.append(f"{name}: {len(got)} answers through the service ({', '.join(got) or 'none'})")
        elif got[0] != pool.get(name):
            problems.append(f"{name}: {got[0]} through the service, {pool.get(name)} through the pool")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=16, help="the server's pool and the pool side, each")
    parser.add_argument("--queue-size", type=int, default=16)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help="tasks and candidates (benchmarks/throughput/manifest.toml)")
    parser.add_argument("--candidates", default=None, help="a glob over the manifest's candidate files")
    parser.add_argument("--order", default="service-first", choices=("service-first", "pool-first"))
    parser.add_argument("--trials", type=int, default=None, help="timed calls per side (default: EvalConfig's)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.trials is not None:
        REQUEST["trials"] = args.trials

    _, candidates = load(args.manifest)
    chosen = select(candidates, args.candidates)
    work = [Work(candidate=c.name, task=c.task.key, task_source=c.task.source, kernel_source=c.source) for c in chosen]
    expected = {c.name: c.expected for c in chosen}
    console = Console(width=120)
    console.print(f"{len(work)} candidates, {args.workers} workers on {args.device}; service with {args.clients} clients")

    figures: dict[str, SideFigures] = {}
    service_answers: dict[str, list[str]] = {}
    pool_answers: dict[str, str] = {}
    sides = ["service", "pool"] if args.order == "service-first" else ["pool", "service"]
    for side in sides:
        cache = Path(tempfile.mkdtemp(prefix=f"serve-throughput-{side}-"))  # cold: nothing built yet
        if side == "service":
            figures[side], service_answers = run_service(work, expected, args.clients, args.workers, args.queue_size, args.device, cache)
        else:
            figures[side], pool_answers = run_pool(work, expected, args.workers, args.device, cache)
        console.print(f"{side}: {figures[side].wall_s:.1f} s")

    table = Table(title=f"candidates per hour on {args.device}: the service against its pool, one command ({args.order})")
    for column in ("side", "candidates", "wall s", "per hour", "as expected", "429 retries", "start-up s"):
        table.add_column(column, justify="right" if column != "side" else "left")
    for f in figures.values():
        start = f"{f.start_s:.1f}" if f.start_s else "-"
        row = (
            f.side,
            str(f.candidates),
            f"{f.wall_s:.1f}",
            f"{f.per_hour:.0f}",
            f"{f.as_expected}/{f.candidates}",
            str(f.retries_429),
            start,
        )
        table.add_row(*row)
    console.print(table)
    ratio = figures["service"].per_hour / figures["pool"].per_hour if figures["pool"].per_hour else float("nan")
    console.print(f"service / pool: {ratio:.2f}x the candidates per hour")
    problems = disagreements(service_answers, pool_answers)
    for line in problems:
        console.print(f"[red]{line}")
    if args.json:
        report: dict[str, Any] = {
            "sides": {k: asdict(v) for k, v in figures.items()},
            "ratio_service_over_pool": ratio,
            "service_answers": service_answers,
            "pool_verdicts": pool_answers,
            "expected": expected,
            "problems": problems,
            "args": {k: str(v) for k, v in vars(args).items()},
        }
        args.json.write_text(json.dumps(report, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
