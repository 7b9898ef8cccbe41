"""`python -m torchops.bench --markdown`: saved --json results become the tables of docs/benchmarks.md."""
import json
import pathlib
import subprocess
import sys

import pytest

from torchops.bench import markdown

SINGLE = {"date": "2026-11-28 01:00 UTC", "machine": "Some CPU, 2 logical cores", "torch": "2.14.1", "device": "cpu",
          "threads": 2, "command": "python -m torchops.bench --device cpu --quick",
          "results": {"bn": [{"case": "train fwd (2, 3, 4, 5) NCHW", "torchops_ms": 1.25, "native_ms": 2.5,
                              "ratio": 0.5, "ratio_min": 0.4, "torchops_faults": 3.0, "torchops_GB/s": 10.0}],
                      "accumulator": [{"case": "apply 64 KB", "torchops_us": 30.0, "add__us": 10.0, "ratio": 3.0},
                                      {"case": "take 64 KB", "latency_us": 80.0}],
                      "batching": {"throughput": [{"mode": "eager", "clients": 16, "speedup": 1.5,
                                                   "batched_cpus": 0.5}]}}}
REPEATED = {"date": "2026-11-28 01:00 UTC", "machine": "Some CPU", "torch": "2.14.1", "device": "cpu", "threads": 2,
            "repeat": 3, "cases": [
                {"family": "rnn", "case": "gru fwd", "value": "ratio", "median": 0.75, "worst": 0.9,
                 "runs": [0.7, 0.75, 0.9]},
                {"family": "rnn", "case": "gru fwd", "value": "torchops/clone", "median": 1.0, "worst": 1.0,
                 "runs": [1.0, 1.0, 1.0]}]}


def test_single_run_tables_have_the_header_and_the_result_columns():
    md = markdown.to_markdown(SINGLE)
    assert "date 2026-11-28 01:00 UTC" in md and "torch 2.14.1" in md and "machine Some CPU" in md
    assert "Command: `python -m torchops.bench --device cpu --quick`" in md
    assert "### bn" in md and "### accumulator" in md
    assert "| case | torchops_ms | native_ms | ratio |" in md
    assert "| train fwd (2, 3, 4, 5) NCHW | 1.25 | 2.5 | 0.5 |" in md
    assert "| apply 64 KB | 30 | 10 | 3 |" in md
    # rows with other columns start their own table; named row lists (batching) are titled
    assert "| case | latency_us |\n|---|---|\n| take 64 KB | 80 |" in md
    assert "throughput:" in md and "| mode | clients | speedup |\n|---|---|---|\n| eager | 16 | 1.5 |" in md
    # diagnostic columns stay in the JSON, not in the reference table
    assert "faults" not in md and "ratio_min" not in md and "GB/s" not in md and "cpus" not in md


def test_repeated_runs_give_median_and_worst_per_case():
    md = markdown.to_markdown(REPEATED)
    assert "over 3 fresh-process runs" in md
    assert "| gru fwd | ratio | 0.75 | 0.9 | 0.7 0.75 0.9 |" in md
    assert "torchops/clone" not in md


def test_command_line_prints_markdown_without_running_benchmarks(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(SINGLE))
    out = subprocess.run([sys.executable, "-m", "torchops.bench", "--markdown", str(path)], capture_output=True,
                         text=True, timeout=120, cwd=pathlib.Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout == markdown.to_markdown(SINGLE)


def test_run_metadata_names_the_run():
    meta = markdown.run_metadata("cpu")
    assert meta["device"] == "cpu" and meta["torch"] and meta["threads"] >= 1
    assert meta["date"].endswith("UTC") and meta["machine"]


def test_case_filter_times_only_the_matching_cases():
    import types

    import torch

    from torchops.bench._timing import compare_cases

    calls = []
    cases = [(name, lambda n=name: calls.append(n), lambda: None) for name in ("lstm train", "gru train", "lstm inf")]
    args = types.SimpleNamespace(quick=True, case="lstm")
    rows = compare_cases(cases, args, torch.device("cpu"), "t")
    assert [r["case"] for r in rows] == ["lstm train", "lstm inf"]
    assert set(calls) == {"lstm train", "lstm inf"}
    args.case = "gru|inf"
    assert [r["case"] for r in compare_cases(cases, args, torch.device("cpu"), "t")] == ["gru train", "lstm inf"]


def test_route_option_times_the_route_against_the_defaults(monkeypatch, capsys):
    # --route runs each family twice, the second time with the route preferred, and reports route/default; the
    # family here is a stand-in that records which route was in force on each run.
    import types

    import torchops
    from torchops.bench import __main__ as bench

    seen = []

    def run(args):
        seen.append(torchops.backends.is_enabled("cudnn_rnn.cpu.onednn"))
        return [{"case": "c", "torchops_ms": 2.0 if seen[-1] else 3.0}]

    monkeypatch.setitem(bench.FAMILIES, "stand_in", types.SimpleNamespace(run=run))
    assert bench.main(["--filter", "stand_in", "--device", "cpu", "--route", "cudnn_rnn.cpu.loops"]) == 0
    assert seen == [True, False]
    assert torchops.backends.is_enabled("cudnn_rnn.cpu.onednn")
    assert "route/default" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown torchops route"):
        bench.main(["--filter", "stand_in", "--device", "cpu", "--route", "nope"])
