"""A load test of `refinery serve`: requests per minute and latency at 1, 4 and 16 concurrent clients.

    python -m benchmarks.serve_load --minutes 10 --json results/serve_load_cpu.json

Starts `refinery serve` (CPU, its own pool of workers) as a child process, then runs one phase per
client count; each client evaluates real C++ candidates in a loop until its phase ends (the soak's
kernels on the built-in ReLU task: a correct one, and every tenth a candidate that segfaults its
worker). A 429 (queue full) is backpressure: the client waits and sends the same evaluation again,
and the retry is counted. It checks that every request got exactly one answer, that each answer
has the verdict its candidate should get, and samples the memory of the server's whole process tree
every few seconds, so that growth over the run shows as a slope.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from benchmarks.serve_process import running_server
from benchmarks.soak.run import HEADER
from kernel_refinery.bench.serve.client import Client, ServiceError

CORRECT = HEADER + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return ext.relu_slow(x, 2)\n"
CRASH = HEADER + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return ext.crash(x)\n"
EXPECTED = {"correct": "correct", "crash": "runtime_error"}
SETTINGS = {"trials": 20, "correctness_trials": 2, "time_compiled_reference": False}
"""Per request: enough trials to be a real evaluation, few enough that the server, not the kernel, is measured."""


@dataclass
class Phase:
    clients: int
    seconds: float
    latencies_s: list[float] = field(default_factory=list)
    verdicts: Counter[str] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    retries_429: int = 0
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    answered: int = 0


@dataclass(frozen=True)
class PhaseFigures:
    clients: int
    requests: int
    per_minute: float
    p50_s: float
    p90_s: float
    p99_s: float
    retries_429: int
    verdicts: dict[str, int]
    wrong_verdicts: int
    errors: int
    lost: int


def _tree_rss_mb(proc: psutil.Process) -> float:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def _client_loop(url: str, token: str, phase: Phase, stop_at: float, index: int, lock: threading.Lock) -> None:
    n = 0
    with Client(url, token, timeout_s=600) as client:
        while time.monotonic() < stop_at:
            kind = "crash" if (index + n) % 10 == 9 else "correct"
            n += 1
            started = time.monotonic()
            with lock:
                phase.sent += 1
            while True:
                try:
                    result = client.evaluate_builtin("1_relu", CRASH if kind == "crash" else CORRECT, **SETTINGS)
                except ServiceError as exc:
                    if exc.status == 429:
                        with lock:
                            phase.retries_429 += 1
                        time.sleep(0.5)
                        continue
                    with lock:
                        phase.errors.append(f"{exc.status}: {exc}")
                        phase.answered += 1
                    break
                except Exception as exc:  # noqa: BLE001 - a load test counts every failure rather than dying on the first
                    with lock:
                        phase.errors.append(repr(exc))
                    break
                status = result.status.value if result.status is not None else "none"
                with lock:
                    phase.answered += 1
                    phase.latencies_s.append(time.monotonic() - started)
                    phase.verdicts[status] += 1
                    if status != EXPECTED[kind]:
                        phase.wrong.append(f"{kind}: {status} {result.message[:200]}")
                break


def run_phase(url: str, token: str, clients: int, seconds: float) -> Phase:
    phase = Phase(clients, seconds)
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    threads = [threading.Thread(target=_client_loop, args=(url, token, phase, stop_at, i, lock)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return phase


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def figures(phase: Phase, wall_s: float) -> PhaseFigures:
    return PhaseFigures(
        clients=phase.clients,
        requests=phase.answered,
        per_minute=60.0 * phase.answered / wall_s,
        p50_s=_quantile(phase.latencies_s, 0.50),
        p90_s=_quantile(phase.latencies_s, 0.90),
        p99_s=_quantile(phase.latencies_s, 0.99),
        retries_429=phase.retries_429,
        verdicts=dict(phase.verdicts),
        wrong_verdicts=len(phase.wrong),
        errors=len(phase.errors),
        lost=phase.sent - phase.answered,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="the whole run; phases share it 2:3:5")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--workers", type=int, default=2, help="the server's pool")
    parser.add_argument("--queue-size", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",")]
    shares = [2, 3, 5][: len(counts)] if len(counts) <= 3 else [1] * len(counts)
    seconds = [60 * args.minutes * s / sum(shares) for s in shares]

    console = Console(width=120)
    memory: list[tuple[float, float]] = []
    phase_starts: list[float] = []
    done = threading.Event()
    with running_server(args.workers, args.queue_size) as server:
        url, token = server.url, server.token
        proc = psutil.Process(server.process.pid)
        t0 = time.monotonic()

        def sample() -> None:
            while not done.wait(5.0):
                memory.append((time.monotonic() - t0, _tree_rss_mb(proc)))

        try:
            # One request first, so that the shared build is cached before any phase is timed.
            with Client(url, token, timeout_s=900) as first:
                first.evaluate_builtin("1_relu", CORRECT, **SETTINGS)
            threading.Thread(target=sample, daemon=True).start()
            results = []
            for clients, phase_s in zip(counts, seconds, strict=True):
                started = time.monotonic()
                phase_starts.append(started - t0)
                phase = run_phase(url, token, clients, phase_s)
                results.append(figures(phase, time.monotonic() - started))
                for line in (phase.wrong + phase.errors)[:5]:
                    console.print(f"[red]{clients} clients: {line}")
        finally:
            done.set()

    table = Table(title=f"refinery serve on CPU: {args.workers} workers, queue {args.queue_size}, {args.minutes:g} min")
    for column in ("clients", "answered", "per minute", "p50 s", "p90 s", "p99 s", "429 retries", "wrong", "errors", "lost"):
        table.add_column(column, justify="right")
    for f in results:
        table.add_row(
            str(f.clients), str(f.requests), f"{f.per_minute:.1f}", f"{f.p50_s:.2f}", f"{f.p90_s:.2f}", f"{f.p99_s:.2f}",
            str(f.retries_429), str(f.wrong_verdicts), str(f.errors), str(f.lost),
        )  # fmt: skip
    console.print(table)
    if len(memory) >= 2:
        first_mb, last_mb = memory[0][1], memory[-1][1]
        span_min = (memory[-1][0] - memory[0][0]) / 60
        slope = statistics.linear_regression([t for t, _ in memory], [m for _, m in memory]).slope * 60
        # The pool starts its second worker with the second client: growth until then is start-up.
        after = [(t, m) for t, m in memory if len(phase_starts) > 1 and t >= phase_starts[1]]
        settled = statistics.linear_regression(*zip(*after, strict=True)).slope * 60 if len(after) >= 2 else float("nan")
        console.print(
            f"memory of the server's process tree: {first_mb:.0f} MB at the start, {last_mb:.0f} MB at the end, "
            f"max {max(m for _, m in memory):.0f} MB over {span_min:.1f} min; fitted slope {slope:+.1f} MB/min, "
            f"{settled:+.1f} MB/min from the second phase on"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"phases": [asdict(f) for f in results], "memory_mb": memory, "args": vars(args) | {"json": str(args.json)}}, indent=1
            )
        )
    bad = any(f.lost or f.wrong_verdicts or f.errors for f in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
