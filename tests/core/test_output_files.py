"""No command writes onto a file a result store owns (records, run log, lock, report, figures), through a symlink or
a hard link either; every output file is written to a temporary file and renamed (kvbounds.core._output_files)."""
from __future__ import annotations

import os

import pytest

from kvbounds.cli import main
from kvbounds.core._output_files import OutputRefused, check_output, store_file, write_output
from kvbounds.core import Record, ResultStore


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with records and its report (report.html, summary.json, figures/, runs.jsonl)."""
    d = tmp_path_factory.mktemp("store")
    assert main(["check", "MR.memory", "--profile", "smoke", "--out", str(d), "--workers", "1", "--quiet"]) == 0
    assert main(["report", "--out", str(d)]) == 0
    assert (d / "runs.jsonl").is_file() and any((d / "figures").iterdir())
    return d


def _snapshot(d):
    return {p.name: p.read_bytes() for p in ResultStore(d).owned_paths()}


def _refused(argv, capsys, *names) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbounds: refusing to write") and len(err.strip().splitlines()) == 1, err
    assert all(n in err for n in names), err
    return err


def test_markdown_onto_any_store_file_is_refused(store, capsys, tmp_path):
    before = _snapshot(store)
    fig = sorted((store / "figures").iterdir())[0]
    for target, what in ((store / "results.jsonl", "records"), (store / "runs.jsonl", "run log"),
                         (store / "summary.json", "report summary"), (store / "report.html", "report"),
                         (fig, "report figure")):
        _refused(["report", "--out", str(store), "--markdown", str(target)], capsys, str(target), what)
    link = tmp_path / "RESULTS.md"
    link.symlink_to(store / "results.jsonl")
    _refused(["report", "--out", str(store), "--markdown", str(link)], capsys, str(link), "(a link)", "records")
    hard = tmp_path / "hard.md"
    os.link(store / "results.jsonl", hard)
    _refused(["report", "--out", str(store), "--markdown", str(hard)], capsys, str(hard), "(a hard link)")
    assert _snapshot(store) == before                       # nothing written, not even the report
    assert main(["report", "--out", str(store), "--markdown", str(tmp_path / "ok.md")]) == 0
    assert (tmp_path / "ok.md").read_text().startswith("#")


def test_report_files_linked_onto_the_records_are_refused(store, capsys, tmp_path):
    import shutil
    d = tmp_path / "copy"
    shutil.copytree(store, d)
    records = (d / "results.jsonl").read_bytes()
    (d / "summary.json").unlink()
    (d / "summary.json").symlink_to("results.jsonl")
    _refused(["report", "--out", str(d)], capsys, "summary.json", "records")
    (d / "summary.json").unlink()
    (d / "report.html").unlink()
    os.link(d / "results.jsonl", d / "report.html")
    _refused(["report", "--out", str(d)], capsys, "report.html", "hard link")
    (d / "report.html").unlink()
    fig = sorted((d / "figures").iterdir())[0]
    fig.unlink()
    fig.symlink_to(d / "results.jsonl")
    assert main(["report", "--out", str(d)]) == 0                # the report removes its old figures (the link)
    assert (d / "results.jsonl").read_bytes() == records and not fig.is_symlink() and fig.stat().st_size > 1000


def test_readme_rewrite_refuses_store_files_and_keeps_its_markers(store, capsys, tmp_path):
    from kvbounds.report.markdown import FOUND_BEGIN, FOUND_END
    from kvbounds.report.markdown import main as rewrite
    before = _snapshot(store)
    link = tmp_path / "README.md"
    link.symlink_to(store / "results.jsonl")
    for target in (store / "results.jsonl", link, store / "summary.json"):
        assert rewrite([str(store), str(target)]) == 2
        assert "refusing to write" in capsys.readouterr().err
    assert _snapshot(store) == before
    plain = tmp_path / "plain.md"
    plain.write_text("no markers here\n")
    assert rewrite([str(store), str(plain)]) == 2 and "markers" in capsys.readouterr().err
    assert plain.read_text() == "no markers here\n"
    good = tmp_path / "good.md"
    good.write_text(f"top\n{FOUND_BEGIN}\nold\n{FOUND_END}\nbottom\n")
    os.chmod(good, 0o640)
    assert rewrite([str(store), str(good)]) == 0
    text = good.read_text()
    assert text.startswith("top\n") and text.endswith("bottom\n") and "MR.memory" in text and "\nold\n" not in text
    assert os.stat(good).st_mode & 0o777 == 0o640                # the file keeps its permissions


def test_run_log_linked_onto_the_records_is_not_appended(tmp_path):
    from kvbounds.core import append_run
    d = tmp_path / "s"
    ResultStore(d).append([Record("X.y", {}, 0, "numpy", 1.0, 2.0, True, key="k")])
    records = (d / "results.jsonl").read_bytes()
    (d / "runs.jsonl").symlink_to("results.jsonl")
    append_run(d, {"wall_s": 1.0})
    assert (d / "results.jsonl").read_bytes() == records
    (d / "runs.jsonl").unlink()
    append_run(d, {"wall_s": 1.0})
    assert (d / "runs.jsonl").read_text().count("wall_s") == 1


def test_write_output_is_atomic_and_refuses_store_files(tmp_path):
    d = tmp_path / "s"
    ResultStore(d).append([Record("X.y", {}, 0, "numpy", 1.0, 2.0, True, key="k")])
    for name in ("results.jsonl", "runs.jsonl", ".kvbounds.lock"):
        assert store_file(tmp_path / "elsewhere" / name)               # by name, wherever it is
    assert store_file(d / "report.html") and not store_file(tmp_path / "report.html")   # a report beside records
    with pytest.raises(OutputRefused, match="records"):
        write_output(d / "results.jsonl", "x")
    target = tmp_path / "out.json"
    target.write_text("old")

    def fails(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError):
        write_output(target, fails)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "s"]
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_output(link, b"new")                                        # a link to a plain file: its target updated
    assert link.is_symlink() and target.read_text() == "new"
    with pytest.raises(OutputRefused, match="directory"):
        check_output(tmp_path)


def test_benchmark_output_onto_records_is_refused(tmp_path):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import _harness
    finally:
        sys.path.pop(0)
    d = tmp_path / "s"
    ResultStore(d).append([Record("X.y", {}, 0, "numpy", 1.0, 2.0, True, key="k")])
    records = (d / "results.jsonl").read_bytes()
    with pytest.raises(OutputRefused):
        _harness.write("bench_x", False, {"a": 1}, d / "results.jsonl")
    assert (d / "results.jsonl").read_bytes() == records
