"""The record store does no harm (issue 43 item 2): a results.jsonl that is no regular file is refused before it is
opened (a FIFO made `check`, `report` and `evaluate` block for ever), a symlinked one is followed only inside its
store (records were appended to whatever file it named), a line of integers beyond float range is one skipped line
(it made every command die with an OverflowError), and `check` and `evaluate` never share a store (evaluate --out
pointed at a check store appended its records there, rc 0), from the CLI and the API, also while the other runs."""
from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

from kvbounds.cli import main
from kvbounds.core import (STORE_FILE, Record, ResultStore, StoreError, StoreOfOtherCommand, store_writer)

BIG = "1" + "0" * 400          # a 400-digit integer: beyond float range


def _rec(i=0, claim="SBW.balance", **kw):
    return Record(claim, {"n": 4 + i}, 0, "numpy", 1.0, 2.0, True, key=f"k{i}", **kw)


@contextlib.contextmanager
def no_hang(seconds=20):
    """Fail (not hang the suite) when the block blocks: a read of a FIFO with no writer never returns."""
    def alarm(signum, frame):
        raise AssertionError(f"blocked for {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _one_line(capsys, *words) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and all(w in err for w in words), err
    return err


# ------------------------------------------------------------------------------------------ not a regular file

def test_a_fifo_as_results_jsonl_is_refused_without_blocking(tmp_path, capsys):
    d = tmp_path / "s"
    d.mkdir()
    os.mkfifo(d / "results.jsonl")
    st = ResultStore(d)
    with no_hang():
        for call in (st.read, st.check_writable, lambda: st.append([_rec()]), lambda: st.lock().release()):
            with pytest.raises(StoreError, match="FIFO"):
                call()
        for argv in (["report", "--out", str(d)], ["list", "--out", str(d), "--brief"], ["show", "SB.cost", "--out",
                                                                                          str(d)],
                     ["check", "MR.memory", "--profile", "smoke", "--out", str(d), "--workers", "1", "--quiet"]):
            assert main(argv) == 1, argv
            _one_line(capsys, "results.jsonl", "FIFO", "not a regular file")
        import kvbounds
        with pytest.raises(StoreError, match="FIFO"):
            kvbounds.evaluate("streaming_llm", profile="smoke", out=d, workers=1, progress=False)
    assert (d / "results.jsonl").is_fifo()


def test_a_fifo_as_the_run_log_neither_blocks_the_report_nor_the_check(tmp_path, capsys):
    d = tmp_path / "s"
    with no_hang():
        assert main(["check", "MR.memory", "--profile", "smoke", "--out", str(d), "--workers", "1", "--quiet"]) == 0
        (d / "runs.jsonl").unlink()
        os.mkfifo(d / "runs.jsonl")
        assert main(["report", "--out", str(d)]) == 0
        assert main(["check", "SB.cost", "--profile", "smoke", "--out", str(d), "--workers", "1", "--quiet"]) == 0
    assert (d / "runs.jsonl").is_fifo()


def test_a_directory_or_a_device_as_results_jsonl_is_refused(tmp_path):
    import stat
    d = tmp_path / "s"
    (d / "results.jsonl").mkdir(parents=True)
    with pytest.raises(StoreError, match="directory"):
        ResultStore(d).read()
    e = tmp_path / "e"
    e.mkdir()
    try:
        os.mknod(e / "results.jsonl", 0o666 | stat.S_IFCHR, os.makedev(1, 3))      # like /dev/null
    except PermissionError:
        pytest.skip("mknod of a character device needs root")
    with no_hang():
        with pytest.raises(StoreError, match="character device"):
            ResultStore(e).append([_rec()])
    assert stat.S_ISCHR(os.lstat(e / "results.jsonl").st_mode)


def test_a_symlinked_results_jsonl_is_followed_only_inside_its_store(tmp_path):
    elsewhere = tmp_path / "notes.txt"
    elsewhere.write_text("my notes\n")
    d = tmp_path / "s"
    d.mkdir()
    (d / "results.jsonl").symlink_to(elsewhere)
    st = ResultStore(d)
    for call in (st.read, lambda: st.append([_rec()]), st.check_writable):
        with pytest.raises(StoreError, match="symbolic link .* outside the store"):
            call()
    assert elsewhere.read_text() == "my notes\n"
    (d / "results.jsonl").unlink()
    ResultStore(d).append([_rec(0)])
    os.rename(d / "results.jsonl", d / "results-2024.jsonl")
    (d / "results.jsonl").symlink_to("results-2024.jsonl")            # a link inside the store: followed
    st.append([_rec(1)])
    assert [r.key for r in st.load()] == ["k0", "k1"]
    (d / "results.jsonl").unlink()
    (d / "results.jsonl").symlink_to("runs.jsonl")                    # onto another file of the store: refused
    with pytest.raises(StoreError, match="outside the store's own files"):
        st.append([_rec(2)])


# ------------------------------------------------------------------------------------------------ bad lines

def test_a_400_digit_integer_is_one_skipped_line_for_every_command(tmp_path, capsys, caplog):
    """`measured` a 400-digit integer made check, report, list --out and evaluate die with an OverflowError."""
    import kvbounds
    good = json.loads(_rec().to_json())
    lines = [dict(good, measured=int(BIG)), dict(good, bound=-int(BIG)), dict(good, time_s=int(BIG))]
    text = "".join(json.dumps(x) + "\n" for x in lines)
    d = tmp_path / "check"
    d.mkdir()
    (d / "results.jsonl").write_text(text)
    with caplog.at_level("WARNING", logger="kvbounds"):
        c = ResultStore(d).read()
        assert (c.unreadable, c.first_unreadable, c.records) == (3, 1, [])
        assert "beyond float range" in c.first_reason
        assert main(["check", "MR.memory", "--profile", "smoke", "--out", str(d), "--workers", "1", "--quiet"]) == 0
        assert main(["list", "--out", str(d), "--brief"]) == 0
        assert main(["report", "--out", str(d)]) == 0
        e = tmp_path / "ev"
        e.mkdir()
        (e / "results.jsonl").write_text(json.dumps(dict(good, claim="evaluate", measured=int(BIG))) + "\n")
        res = kvbounds.evaluate("streaming_llm", profile="smoke", out=e, workers=1, progress=False)
        assert res["streams"] == 20
    warned = [r.getMessage() for r in caplog.records if "not records" in r.getMessage()]
    assert any("(first: line 1: " in w and "beyond float range" in w for w in warned), warned


# ---------------------------------------------------------------------------------- check and evaluate apart

def test_check_and_evaluate_never_share_a_store(tmp_path, capsys):
    import kvbounds
    chk = tmp_path / "chk"
    assert main(["check", "MR.memory", "--profile", "smoke", "--out", str(chk), "--workers", "1", "--quiet"]) == 0
    assert store_writer(chk) == "check" and json.loads((chk / STORE_FILE).read_text()) == {"writer": "check"}
    before = (chk / "results.jsonl").read_bytes()
    assert main(["evaluate", "streaming_llm", "--profile", "smoke", "--out", str(chk), "--workers", "1"]) == 2
    _one_line(capsys, "is a `kvbounds check` result store", "use another --out")
    with pytest.raises(StoreOfOtherCommand, match="kvbounds check"):
        kvbounds.evaluate("streaming_llm", profile="smoke", out=chk, workers=1, progress=False)
    assert (chk / "results.jsonl").read_bytes() == before and not (chk / "evaluation.json").exists()

    ev = tmp_path / "ev"
    kvbounds.evaluate("streaming_llm", profile="smoke", out=ev, workers=1, progress=False)
    assert store_writer(ev) == "evaluate"
    before = (ev / "results.jsonl").read_bytes()
    assert main(["check", "MR.memory", "--profile", "smoke", "--out", str(ev), "--workers", "1", "--quiet"]) == 2
    _one_line(capsys, "is a `kvbounds evaluate` result store")
    from kvbounds.run import run_checks
    with pytest.raises(StoreOfOtherCommand):
        run_checks(["MR.memory"], profile="smoke", out=ev, workers=1, progress=False)
    assert main(["report", "--out", str(ev)]) == 2
    _one_line(capsys, "is a `kvbounds evaluate` store", "evaluation.html")
    assert (ev / "results.jsonl").read_bytes() == before and not (ev / "report.html").exists()


def test_a_store_of_a_running_command_is_refused_by_the_other(tmp_path):
    """While `check` holds its store (its lock, taken with its marker written), `evaluate` on it is refused, and the
    other way round; a store written before markers is known by its records."""
    import kvbounds
    d = tmp_path / "running"
    with ResultStore(d, writer="check").lock():
        with pytest.raises(StoreOfOtherCommand):
            kvbounds.evaluate("streaming_llm", profile="smoke", out=d, workers=1, progress=False)
    e = tmp_path / "running-ev"
    with ResultStore(e, writer="evaluate").lock():
        with pytest.raises(StoreOfOtherCommand):
            ResultStore(e, writer="check").lock()
    old = tmp_path / "old"                          # no marker: an evaluate record says whose it is
    ResultStore(old).append([_rec(0, claim="evaluate")])
    assert store_writer(old) == "evaluate"
    with pytest.raises(StoreOfOtherCommand):
        ResultStore(old, writer="check").lock()
    (old / STORE_FILE).write_text("not json")       # a damaged marker: the records decide, the lock rewrites it
    with ResultStore(old, writer="evaluate").lock():
        pass
    assert json.loads((old / STORE_FILE).read_text()) == {"writer": "evaluate"}
