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


# ------------------------------------------------------------------ issue 43: special files, other stores, own inputs

def _special_files(d):
    """name -> path of a FIFO, a socket, a directory and (as root: mknod) a character device like /dev/null (1, 3),
    made in ``d``, and a symlink to each (``link-NAME``); the sockets are returned to be closed."""
    import socket
    import stat
    d.mkdir()
    made = {"fifo": d / "fifo", "socket": d / "sock", "directory": d / "dir"}
    os.mkfifo(made["fifo"])
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(made["socket"]))
    made["directory"].mkdir()
    try:
        os.mknod(d / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made["device"] = d / "null"
    except PermissionError:
        pass
    for name, p in list(made.items()):
        (d / f"link-{name}").symlink_to(p)
        made[f"link to a {name}"] = d / f"link-{name}"
    return made, sock


WHAT = {"fifo": "FIFO", "socket": "socket", "directory": "directory", "device": "character device"}


def _kinds_unchanged(made):
    import stat
    tests = {"fifo": stat.S_ISFIFO, "socket": stat.S_ISSOCK, "directory": stat.S_ISDIR, "device": stat.S_ISCHR}
    return all(tests[k](os.stat(p).st_mode) for k, p in made.items() if k in tests)


def test_a_dev_null_node_is_never_replaced_by_any_command(store, capsys, tmp_path):
    """`kvbounds report --markdown /dev/null` run as root replaced the system's /dev/null with a regular file (so did
    summary_read, report_markdown and the benchmarks' JSON): here a node like /dev/null (1, 3) made in a temporary
    directory, and a link to it, are refused by each, exit 2 naming it, the node left a device."""
    import stat
    from kvbounds.report.markdown import main as rewrite
    from kvbounds.report.summary_read import main as compact_main
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod of a character device needs root (a /dev/null-like node cannot be made here)")
    link = tmp_path / "link"
    link.symlink_to(null)
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    for target in (null, link):
        _refused(["report", "--out", str(store), "--markdown", str(target)], capsys, str(target), "character device")
        assert compact_main([str(store / "summary.json"), str(target)]) == 2
        assert rewrite([str(store / "summary.json"), str(readme), str(target)]) == 2
        assert rewrite([str(store / "summary.json"), str(target)]) == 2
        assert capsys.readouterr().err.count("character device") == 3
        with pytest.raises(OutputRefused, match="character device"):
            write_output(target, "x")
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.lstat(null).st_rdev == os.makedev(1, 3)


def test_the_real_dev_null_is_refused_without_a_write():
    """check_output only looks (nothing is written): /dev/null itself, and a link to it, are refused."""
    for p in ("/dev/null", os.devnull):
        with pytest.raises(OutputRefused, match="character device"):
            check_output(p)


def test_report_markdown_onto_a_special_file_is_refused_before_any_work(store, capsys, tmp_path):
    made, sock = _special_files(tmp_path / "special")
    try:
        before = _snapshot(store)
        for name, p in made.items():
            err = _refused(["report", "--out", str(store), "--markdown", str(p)], capsys, str(p))
            assert WHAT[name.rsplit(" ", 1)[-1]] in err, (name, err)
            assert ("(a link)" in err) == name.startswith("link"), err
        assert _snapshot(store) == before and _kinds_unchanged(made)       # no report written, nothing replaced
        assert sorted(p.name for p in (tmp_path / "special").iterdir() if p.name.startswith(".")) == []
    finally:
        sock.close()


def test_write_output_and_the_report_refuse_special_files(store, tmp_path):
    import shutil
    made, sock = _special_files(tmp_path / "special")
    try:
        for name, p in made.items():
            with pytest.raises(OutputRefused, match=WHAT[name.rsplit(" ", 1)[-1]]):
                write_output(p, "x")
        assert _kinds_unchanged(made)
        d = tmp_path / "copy"
        shutil.copytree(store, d)
        for name in ("summary.json", "report.html"):               # the report's own files as FIFOs: refused
            (d / name).unlink()
            os.mkfifo(d / name)
            with pytest.raises(OutputRefused, match="FIFO"):
                from kvbounds.report import write_report
                write_report(d)
            (d / name).unlink()
        figs = d / "figures"
        shutil.rmtree(figs)
        figs.symlink_to(tmp_path / "special")                      # its pngs would be removed in another directory
        with pytest.raises(OutputRefused, match="link"):
            write_report(d)
        figs.unlink()
        figs.mkdir()
        os.mkfifo(figs / "x.png")
        with pytest.raises(OutputRefused, match="FIFO"):
            write_report(d)
        assert (d / "results.jsonl").read_bytes() == (store / "results.jsonl").read_bytes()
    finally:
        sock.close()


def test_a_path_inside_another_store_is_refused(store, capsys, tmp_path):
    """`report --out A --markdown B/x.md` with B another `check` store, or an `evaluate` store: refused; inside A
    (the command's own store) and outside any store: written."""
    from kvbounds.report.summary_read import main as compact_main
    other = tmp_path / "other"
    ResultStore(other, writer="check").lock().release()
    ResultStore(other).append([Record("X.y", {}, 0, "numpy", 1.0, 2.0, True, key="k")])
    ev = tmp_path / "ev"
    ResultStore(ev, writer="evaluate").lock().release()
    (ev / "results.jsonl").write_text("")
    for d, who in ((other, "`kvbounds check` result store"), (ev, "`kvbounds evaluate` result store")):
        err = _refused(["report", "--out", str(store), "--markdown", str(d / "x.md")], capsys, str(d / "x.md"), who)
        assert "does not own" in err
        assert compact_main([str(store / "summary.json"), str(d / "compact.json")]) == 2
        assert "does not own" in capsys.readouterr().err and not (d / "compact.json").exists()
    assert main(["report", "--out", str(store), "--markdown", str(store / "RESULTS.md")]) == 0     # its own store
    assert (store / "RESULTS.md").is_file()
    (store / "RESULTS.md").unlink()


def test_the_commands_own_input_is_refused(store, capsys, tmp_path):
    """`python -m kvbounds.report.markdown SRC README RESULTS` with RESULTS = SRC (or README = SRC) overwrote its own
    summary.json with markdown, rc 0; summary_read SUMMARY SUMMARY the same."""
    import shutil
    from kvbounds.report.markdown import FOUND_BEGIN, FOUND_END
    from kvbounds.report.markdown import main as rewrite
    from kvbounds.report.summary_read import main as compact_main
    src = tmp_path / "summary.json"
    shutil.copy(store / "summary.json", src)
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{FOUND_BEGIN}\n{FOUND_END}\n")
    before = src.read_bytes(), readme.read_bytes()
    link = tmp_path / "link.json"
    link.symlink_to(src)
    for argv in ([src, readme, src], [src, readme, link], [src, src], [src, readme, readme]):
        assert rewrite([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert "the command's own input" in err and len(err.strip().splitlines()) == 1, err
    for out in (src, link):
        assert compact_main([str(src), str(out)]) == 2 and "own input" in capsys.readouterr().err
    assert (src.read_bytes(), readme.read_bytes()) == before
    assert rewrite([str(src), str(readme), str(tmp_path / "RESULTS.md")]) == 0
    assert (tmp_path / "RESULTS.md").read_text().startswith("#")


def test_a_benchmarks_out_is_checked_before_any_work(tmp_path):
    """A benchmark's --out onto a FIFO, a directory, a store file or into a store: argparse's exit 2 naming it,
    before the benchmark runs (the type of --out is _harness.output_path)."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    d = tmp_path / "s"
    ResultStore(d).append([Record("X.y", {}, 0, "numpy", 1.0, 2.0, True, key="k")])
    os.mkfifo(tmp_path / "fifo.json")
    for target, words in ((tmp_path / "fifo.json", "FIFO"), (tmp_path, "directory"), (d / "results.jsonl", "records"),
                          (d / "bench.json", "inside")):
        r = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_kcenter_traversal.py"), "--n", "64",
                            "--reps", "1", "--out", str(target)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "argument --out" in r.stderr and words in r.stderr, r.stderr
        assert "wrote" not in r.stdout
    assert stat_is_fifo(tmp_path / "fifo.json")
    # walk_cause's --json likewise (it wrote with a plain open() before)
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "walk_cause.py"), "--json", str(tmp_path / "fifo.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "argument --json" in r.stderr and "FIFO" in r.stderr, r.stderr
    assert stat_is_fifo(tmp_path / "fifo.json")


def stat_is_fifo(p) -> bool:
    import stat
    return stat.S_ISFIFO(os.stat(p).st_mode)
