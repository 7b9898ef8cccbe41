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
                      "batching": [
                          {"table": "throughput", "case": "eager c16 mb8 nbt1", "mode": "eager", "clients": 16,
                           "max_batch": 8, "nbt": 1, "unbatched_req/s": 1000.0, "batched_req/s": 1500.0,
                           "speedup": 1.5, "unbatched_p50_us": 900.0, "unbatched_p99_us": 9000.0,
                           "batched_p50_us": 700.0, "batched_p99_us": 2000.0, "batched_cpus": 0.5,
                           "cpu_us_per_req": 120.0},
                          {"table": "throughput", "case": "eager c16 mb8 nbt2", "mode": "eager", "clients": 16,
                           "max_batch": 8, "nbt": 2, "unbatched_req/s": 1000.0, "batched_req/s": 1200.0,
                           "speedup": 1.2, "unbatched_p50_us": 900.0, "unbatched_p99_us": 9000.0,
                           "batched_p50_us": 800.0, "batched_p99_us": 2500.0},
                          {"table": "added_latency", "mode": "script", "batch_timeout_us": 0, "unbatched_p50_us": 60.0,
                           "batched_p50_us": 70.0, "batched_p99_us": 150.0, "added_p50_us": 10.0, "budget_us": 200,
                           "met": True},
                          {"table": "ceiling", "case": "ceiling c16 mb8", "clients": 16, "ceiling_req/s": 7e4}]}}
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
    # one summary table per family: case, both sides' times with their unit, ratio
    assert "| case | torchops | PyTorch | ratio |\n|---|---|---|---|\n| train fwd (2, 3, 4, 5) NCHW | 1.25 ms | 2.5 ms | 0.5 |" in md
    assert "| apply 64 KB | 30 µs | 10 µs (`add_`) | 3 |" in md  # a PyTorch side other than `native` is named
    # rows that compare nothing follow their family's summary
    assert "Also measured:\n\n| case | latency_us |\n|---|---|\n| take 64 KB | 80 |" in md
    # batching: the better num_batch_threads per mode, clients and max batch; both sides' req/s and p50 / p99
    assert ("| mode | clients | max batch | batch threads | direct req/s | batched req/s | speedup | "
            "direct p50 / p99 µs | batched p50 / p99 µs |") in md
    assert "| eager | 16 | 8 | 1 | 1000 | 1500 | 1.5 | 900 / 9000 | 700 / 2000 |" in md
    assert "| eager | 16 | 8 | 2 |" not in md
    assert "| script | 0 | 60 | 70 / 150 | 10 |" in md
    # diagnostic columns and tables stay in the JSON, not in the reference table
    for word in ("faults", "ratio_min", "GB/s", "cpus", "cpu_us_per_req", "ceiling", "nbt2"):
        assert word not in md, word


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


DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def test_benchmark_page_tables_are_generated_from_its_json():
    # docs/benchmarks.md shows exactly what `--markdown docs/benchmarks_cpu.json` prints (tables cannot drift).
    data = json.loads((DOCS / "benchmarks_cpu.json").read_text())
    page = (DOCS / "benchmarks.md").read_text()
    assert markdown.to_markdown(data) in page
    assert "](benchmarks_cpu.png)" in page and (DOCS / "benchmarks_cpu.png").is_file()
    # one summary table per family: no family section holds more than its summary and the "Also measured" ones
    for section in page.split("\n### ")[1:]:
        section = section.split("\n## ")[0]
        tables = section.count("\n|---")
        assert tables <= 1 + 2 * section.count("Also measured:") + section.count("Added latency"), section[:200]


def test_plot_series_are_time_ratios_below_one_when_torchops_is_faster():
    from torchops.bench import plot

    s = plot.series(SINGLE)
    assert s["bn"] == [("train fwd (2, 3, 4, 5) NCHW", 0.5, None)]
    assert s["accumulator"] == [("apply 64 KB", 3.0, None)]  # the latency row has no ratio: not plotted
    # batching: direct / batched requests per second, the better num_batch_threads only
    assert s["batching"] == [("eager c16 mb8", 1 / 1.5, None)]
    r = plot.series(REPEATED)
    assert r == {"rnn": [("gru fwd", 0.75, 0.9)]}


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(SINGLE))
    out = tmp_path / "out.png"
    from torchops.bench import plot

    assert plot.main(str(path), str(out)) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_so(tmp_path, monkeypatch, capsys):
    from torchops.bench import plot

    path = tmp_path / "run.json"
    path.write_text(json.dumps(SINGLE))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing it raises ImportError
    assert plot.main(str(path), str(tmp_path / "out.png")) == 2
    assert "needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "out.png").exists()


def test_plot_of_a_file_without_ratios_is_a_clear_error(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from torchops.bench import plot

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"results": {"accumulator": [{"case": "take", "latency_us": 3.0}]}}))
    assert plot.main(str(path), str(tmp_path / "out.png")) == 2
    assert "no torchops / PyTorch ratios" in capsys.readouterr().err
