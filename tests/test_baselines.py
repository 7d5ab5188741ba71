"""The baseline a speedup is against, on a scripted CPU experiment: `--baseline compile` changes the
table's speedups (torch.compile of the reference, with GCC as its C++ compiler here), the report's
header says which baseline, and the report counts fast_1 entries inside the A/A noise band."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from cli_runner import run_cli

from kernel_refinery.bench.experiment import read_results

SOLUTIONS = Path(__file__).parent / "fixtures" / "cpu_solutions"


refinery = partial(run_cli, columns=200)


def test_the_baseline_changes_the_speedups_and_the_header_says_which(tmp_path: Path, cache_dir: Path) -> None:
    code = (SOLUTIONS / "1_relu.py").read_text()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"level1/1_relu": [f"```python\n{code}```\n"]}))
    toml = tmp_path / "experiment.toml"
    toml.write_text(
        f'tasks = "1_relu"\nlevels = [1]\nvariants = ["G"]\nworkers = 1\nconcurrency = 1\n'
        f'[loop]\nturns = 1\nhardware_prompt = false\n[llm]\nmodel = "scripted:{script}"\n'
        f'[eval]\ntrials = 20\nwarmup = 2\ncorrectness_trials = 2\ntime_compiled_reference = false\ncache_dir = "{cache_dir}"\n'
    )
    speedups, reports = {}, {}
    for baseline in ("eager", "compile"):
        run_dir = tmp_path / baseline
        result = refinery("experiment", "--config", toml, "--baseline", baseline, "--run-dir", run_dir)
        assert result.exit_code == 0, result.output
        (record,) = read_results(run_dir)
        assert record.best_speedup is not None, record
        speedups[baseline] = record.best_speedup
        traces = [json.loads(line) for path in (run_dir / "traces").glob("*.jsonl") for line in path.read_text().splitlines()]
        timing = next(t["result"]["timing"] for t in traces if t.get("result") and t["result"].get("timing"))
        assert timing["baseline"] == baseline and timing["noise_band"] is not None
        assert record.best_within_noise == timing["within_noise"]
        report = refinery("report", run_dir, "--no-plots")
        assert report.exit_code == 0, report.output
        reports[baseline] = report.output
        assert f"speedups against {baseline}" in report.output
        fast_1 = int(record.best_speedup > 1)
        within = int(bool(record.best_within_noise) and fast_1)
        assert f"fast_1 within the noise band: {within} of {fast_1}" in report.output
    # The same kernel against another baseline: torch.compile's time is not eager's.
    assert speedups["compile"] != speedups["eager"]
