"""The runner: resume, error records, the output-directory lock, write errors, progress, verdicts; and,
in subprocesses, what happens to the pool when the main process is killed, interrupted or had torch."""
import concurrent.futures as cf
import contextlib
import dataclasses
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter

import pytest

from kvbounds import claims as registry
from kvbounds.cli import main
from kvbounds.core._records import Record, ResultStore, StoreLocked, canonical
from kvbounds.claims import CLAIMS, Claim, get_claim
from kvbounds.run._runner import Progress, Trial, _as_completed, expand, run_checks, trial_seed

FAKE = '''
import os, time
from kvbounds.core._records import Record
from kvbounds.verdict import Verdict
CLAIM = {claim!r}
def trials(profile):
    return [dict(i=i) for i in range({n})]
def run_trial(params, seed, backend):
{body}
    return [Record(CLAIM, params, seed, backend, measured=params["i"], bound=10, holds=True, check=c)
            for c in ("a", "b", "c")]
def summarize(records):
    return Verdict(CLAIM, "holds", f"{{len(records)}} fake records")
'''


def _fake_module(tmp_path, name, body="pass", n=4):
    """A check module FAKE.<name> in tmp_path: n trials of three records each; ``body`` runs first."""
    mod = f"kvb_fake_{name.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    src = FAKE.format(claim=f"FAKE.{name}", n=n, body=textwrap.indent(textwrap.dedent(body), "    "))
    (tmp_path / f"{mod}.py").write_text(src)
    return mod


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Register a fake claim in this process; returns its id."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(name, body="pass", n=4):
        mod = _fake_module(tmp_path, name, body, n)
        cid = f"FAKE.{name}"
        monkeypatch.setitem(registry.CLAIMS, cid, Claim(cid, "test", "a fake claim", "tests", check=mod))
        return cid
    return make


def _thread_ex():
    return cf.ThreadPoolExecutor(1)


def test_registry_covers_catalogue_ids():
    from kvbounds.claims import papers_in
    assert {"SBW.balance", "BKV.e2e", "SG.decode"} <= set(CLAIMS)
    for cid, c in CLAIMS.items():     # each entry: its check module checks it, its source names a registered paper
        assert c.id == cid and papers_in(c.source), cid
        assert c.check_module().CLAIM == cid, cid
    with pytest.raises(KeyError, match="unknown claim"):
        get_claim("NOPE.x")


def test_resume_skips_finished_trials(tmp_path):
    first = run_checks(["SBW.balance"], profile="smoke", out=tmp_path, executor=_thread_ex(), progress=False)
    assert first and all(r.key for r in first)
    again = run_checks(["SBW.balance"], profile="smoke", out=tmp_path, executor=_thread_ex(), progress=False)
    assert again == []
    assert len(ResultStore(tmp_path).load()) == len(first)


def test_truncated_multi_record_trial_is_rerun_without_duplicates(tmp_path):
    """MR.memory has four records per trial: cutting the last line used to make resume append the
    whole trial again next to its three intact records."""
    first = run_checks(["MR.memory"], profile="smoke", out=tmp_path, executor=_thread_ex(), progress=False)
    assert max(r.extra["trial_size"] for r in first) > 1
    st = ResultStore(tmp_path)
    data = st.path.read_bytes()
    st.path.write_bytes(data[:data.rstrip(b"\n").rfind(b"\n") + 40])          # last record half-written
    assert len(st.load()) == len(first) - first[-1].extra["trial_size"]      # the cut trial is left out whole
    redo = run_checks(["MR.memory"], profile="smoke", out=tmp_path, executor=_thread_ex(), progress=False)
    assert len(redo) == first[-1].extra["trial_size"]
    recs = ResultStore(tmp_path).load()
    assert len(recs) == len(first)
    per_trial = Counter(r.key for r in recs)
    assert all(n == r.extra["trial_size"] for r in recs for n in [per_trial[r.key]])
    assert max(Counter((r.key, r.check, str(r.params)) for r in recs).values()) == 1


def test_trial_seed_is_backend_independent():
    assert trial_seed(0, "X", {"n": 1}) == trial_seed(0, "X", {"n": 1}) != trial_seed(1, "X", {"n": 1})


def test_bad_profile_and_backend(tmp_path):
    with pytest.raises(ValueError, match="profile"):
        expand([get_claim("SBW.balance")], "huge", 0, "numpy")
    with pytest.raises(ValueError, match="unknown backend"):
        run_checks(["SBW.balance"], backend="tpu", out=tmp_path, progress=False)


# ------------------------------------------------------------------------------ failing trials

def test_failing_trial_is_an_error_record_and_the_sweep_goes_on(tmp_path, fake):
    flag = tmp_path / "broken"
    flag.touch()
    cid = fake("flaky", f'if params["i"] == 2 and os.path.exists({str(flag)!r}):\n    raise ValueError("boom at i=2")')
    written = run_checks([cid], profile="smoke", out=tmp_path, executor=_thread_ex(), progress=False)
    assert len(written) == 9                                      # three trials of three records; no errors
    st = ResultStore(tmp_path)
    assert len(st.load()) == 9 and all(not r.is_error for r in st.load())
    (err,) = st.errors()
    assert err.claim == cid and err.params == {"i": 2} and err.error == "ValueError: boom at i=2"
    assert "run_trial" in err.extra["traceback"] and not err.holds and err.check == "error"
    flag.unlink()                                                 # fixed: the next run retries only that trial
    again = run_checks([cid], profile="smoke", out=tmp_path, executor=_thread_ex(), progress=False)
    assert [r.params["i"] for r in again] == [2, 2, 2]
    assert st.errors() == [] and len(st.load()) == 12


def test_error_records_do_not_count_as_violations_in_verdicts(tmp_path, fake, capsys):
    cid = fake("always-fails", 'raise RuntimeError("nope")', n=2)
    assert main(["check", cid, "--profile", "smoke", "--out", str(tmp_path), "--workers", "1"]) == 0
    out, err = capsys.readouterr()
    assert "2 trial(s) failed with an error" in out
    assert err.count("RuntimeError: nope") == 2 and "Traceback" not in err
    assert ResultStore(tmp_path).load() == []


def test_check_prints_the_verdicts_of_the_claims_it_ran(tmp_path, fake, capsys):
    cid = fake("fine", n=2)
    assert main(["check", cid, "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"{cid}  bound holds: 6 fake records" in out
    assert "outside their bound" not in out and "SBW.balance" not in out


# ------------------------------------------------------------------------- the output directory

def test_second_check_on_a_directory_refuses(tmp_path, fake, capsys):
    cid = fake("locked", n=2)
    with ResultStore(tmp_path).lock():
        with pytest.raises(StoreLocked, match="another `kvbounds check` is writing"):
            run_checks([cid], profile="smoke", out=tmp_path, executor=_thread_ex(), progress=False)
        assert main(["check", cid, "--profile", "smoke", "--out", str(tmp_path), "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another `kvbounds check`" in err
    assert ResultStore(tmp_path).load() == []
    assert len(run_checks([cid], profile="smoke", out=tmp_path, executor=_thread_ex(), progress=False)) == 6


def test_unusable_output_directory_fails_before_any_trial(tmp_path, fake, capsys, monkeypatch):
    ran = tmp_path / "ran"
    cid = fake("never", f"open({str(ran)!r}, 'w').close()", n=2)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["check", cid, "--profile", "smoke", "--out", str(a_file), "--workers", "1"]) == 1
    assert capsys.readouterr().err == f"kvbounds: error: output directory {a_file} is a file, not a directory\n"
    # read-only (root ignores permission bits, so the file system's answer is simulated)
    real_open = os.open

    def read_only(path, *a, **k):
        if str(path).endswith("results.jsonl"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_open(path, *a, **k)
    with monkeypatch.context() as m:
        m.setattr(os, "open", read_only)
        assert main(["check", cid, "--profile", "smoke", "--out", str(tmp_path / "ro"), "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kvbounds: error: cannot write to") and "Read-only file system" in err and err.count("\n") == 1
    assert not ran.exists()
    deep = tmp_path / "missing" / "deeper"                       # a missing directory is created
    assert main(["check", cid, "--profile", "smoke", "--out", str(deep), "--workers", "1", "--quiet"]) == 0
    assert len(ResultStore(deep).load()) == 6


def test_disk_full_stops_with_one_line_and_loses_no_finished_trial(tmp_path, fake, capsys, monkeypatch):
    cid = fake("disk", n=5)
    real_write = os.write
    calls = {"n": 0}

    def full_after_two(fd, data):
        if bytes(data).startswith(b'{"writer"'):             # the store's marker (written when it is locked)
            return real_write(fd, data)
        calls["n"] += 1
        if calls["n"] <= 2:
            return real_write(fd, data)
        real_write(fd, bytes(data[:len(data) // 2]))           # half a trial reaches the disk
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with monkeypatch.context() as m:
        m.setattr(os, "write", full_after_two)
        assert main(["check", cid, "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "2 trial(s) written before are kept" in err
    assert len(ResultStore(tmp_path).load()) == 6
    assert main(["check", cid, "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 0
    recs = ResultStore(tmp_path).load()
    assert len(recs) == 15 and len({(r.key, r.check) for r in recs}) == 15


def test_short_writes_are_completed(tmp_path, fake, monkeypatch):
    cid = fake("short", n=3)
    real_write = os.write
    with monkeypatch.context() as m:
        m.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
        run_checks([cid], profile="smoke", out=tmp_path, executor=_thread_ex(), progress=False)
    assert len(ResultStore(tmp_path).load()) == 9


def test_ctrl_c_says_how_to_resume(tmp_path, fake, capsys):
    cid = fake("interrupt", 'if params["i"] == 1:\n    raise KeyboardInterrupt', n=3)
    assert main(["check", cid, "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and "rerun the same command to resume" in err
    assert len(ResultStore(tmp_path).load()) == 3                  # the trial finished before is kept


def test_trials_finished_together_come_in_submission_order():
    """A worker runs on after a trial raises (a Ctrl-C): the next trial can finish within the same wake, and
    must not be stored before the one that ends the run (CI once stored 6 records, not 3, above)."""
    futs = {}
    for i in (0, 1, 2):
        f = cf.Future()
        futs[f] = Trial("X.y", {"i": i}, 0, "numpy")
    for f in reversed(list(futs)):                     # finished in the reverse order, all before the first wake
        f.set_result(None)
    assert [futs[f].params["i"] for f in _as_completed(futs)] == [0, 1, 2]


# ------------------------------------------------------------------------------------- progress

def test_progress_plain_lines_when_not_a_terminal(capsys):
    p = Progress(3, stream=sys.stderr)
    for _ in range(3):
        p.step(Trial("X.y", {}, 0, "numpy"), [])
    p.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("[   1/3] X.y") and "elapsed" in lines[0] and "eta" in lines[0]
    assert lines[-1].startswith("[   3/3]")


def test_progress_bar_on_a_terminal():
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True
    s = Tty()
    p = Progress(2, stream=s)
    p.step(Trial("X.y", {}, 0, "numpy"), [])
    p.step(Trial("X.y", {}, 0, "numpy"), [])
    p.close()
    assert p.bar is not None and "2/2" in s.getvalue() and "[   1/2]" not in s.getvalue()


# ------------------------------------------------------------------- threads: records identical

def test_records_do_not_depend_on_the_number_of_workers(tmp_path, fake):
    """--workers 1 used to skip the one-thread setup: multi-threaded BLAS changed the last bits of
    SBW.kernel-identity's truncation errors (quick profile, d = 4, m = 8) relative to the pool workers."""
    grid = [t.params for t in expand([get_claim("SBW.kernel-identity")], "quick", 0, "numpy")
            if t.params.get("check") == "truncation" and t.params["d"] == 4 and t.params["m"] == 8][:3]
    assert grid
    cid = fake("kernel-identity-subset", n=0)
    mod = registry.CLAIMS[cid].check
    (tmp_path / f"{mod}.py").write_text(
        "from kvbounds.proofs_checks.sbw_kernel_identity import run_trial, summarize\n"
        f"def trials(profile):\n    return {grid!r}\n")
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=max(os.cpu_count() or 1, 2)):   # this thread owns OpenBLAS's limit, as in pytest
        for w in (1, 2):
            run_checks([cid], profile="smoke", out=tmp_path / str(w), workers=w, progress=False)
    got = [sorted((r.key, r.check, r.measured, r.bound, r.holds) for r in ResultStore(tmp_path / str(w)).load())
           for w in (1, 2)]
    assert len(got[0]) == len(grid) and got[0] == got[1]


def test_cli_records_identical_for_one_and_two_workers(tmp_path):
    fields = lambda d: sorted((r.key, r.check, canonical(r.params), r.measured, r.bound, r.holds)
                              for r in ResultStore(d).load())
    for w in ("1", "2"):
        assert main(["check", "SBW.kernel-identity", "SB.discrepancy", "--profile", "smoke", "--workers", w,
                     "--out", str(tmp_path / w), "--quiet"]) == 0
    assert fields(tmp_path / "1") == fields(tmp_path / "2")


# ------------------------------------------------------- the pool and its parent (subprocesses)
DRIVER = '''
import faulthandler, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)     # a hang's stacks, on request (see _communicate)
# a terminal's foreground command: Ctrl-C raises KeyboardInterrupt. A test run started in the background by a shell
# without job control inherits SIGINT ignored, which Python (rightly) keeps: `kvbounds check &` ignores Ctrl-C
signal.signal(signal.SIGINT, signal.default_int_handler)
from kvbounds.claims import CLAIMS, Claim
for arg in sys.argv:
    if arg.startswith("FAKE."):
        CLAIMS[arg] = Claim(arg, "test", "a fake claim", "tests", check=sys.argv[sys.argv.index(arg) + 1])
if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "--torch-first":                 # torch's OpenMP pool running in the parent
        import torch
        torch.set_num_threads(2)
        x = torch.randn(600, 600)
        float((x @ x).sum())
        args = args[1:]
    claim, module, *rest = args
    from kvbounds.cli import main
    sys.exit(main(["check", claim, *rest]))
'''

SLOW = '''
open(os.path.join(os.environ["KVB_PIDS"], str(os.getpid())), "w").close()
time.sleep(float(os.environ["KVB_SLEEP"]))
'''


def _start(tmp_path, name, body, *args, sleep=600.0, n=4, torch_first=False):
    mod = _fake_module(tmp_path, name, body, n)
    (tmp_path / "driver.py").write_text(DRIVER)
    (tmp_path / "pids").mkdir(exist_ok=True)
    env = {**os.environ, "KVB_PIDS": str(tmp_path / "pids"), "KVB_SLEEP": str(sleep),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(tmp_path / "driver.py"), *(["--torch-first"] if torch_first else []),
           f"FAKE.{name}", mod, "--profile", "smoke", "--out", str(tmp_path / "out"), *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


# The timeouts below only bound a hang: on a quiet machine each wait ends within seconds; they are generous so a
# heavily loaded machine (a parallel test run beside other work: interpreter start-up, imports and the fork
# server's preload slowed several-fold) cannot fail a test that would pass.
HANG = 300.0


def _pids(tmp_path, n, proc, timeout=HANG):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        pids = [int(p.name) for p in (tmp_path / "pids").iterdir()]
        if len(pids) >= n:
            return pids
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("workers did not start")


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"     # a zombie has exited
    except OSError:
        return True


def _wait_gone(pids, timeout=HANG / 2):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and not all(map(_gone, pids)):
        time.sleep(0.1)
    return [p for p in pids if not _gone(p)]


def _communicate(proc):
    """proc.communicate(timeout=HANG); on a hang, the failure shows where every thread of the main process waits
    (the driver's faulthandler dumps them on SIGUSR1), so a rare hang is diagnosable from one CI log."""
    try:
        return proc.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the main process did not exit within {HANG:g} s; its threads:\n{err[-6000:]}")


def _cleanup(proc, pids=()):
    for pid in pids:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["kill-9", "term", "int"])
def test_workers_die_with_the_main_process(tmp_path, sig):
    proc = _start(tmp_path, "slow", SLOW, "--workers", "2")
    pids = []
    try:
        pids = _pids(tmp_path, 2, proc)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)          # Ctrl-C on a terminal: the whole foreground process group
        else:
            os.kill(proc.pid, sig)
        out, err = _communicate(proc)
        assert _wait_gone(pids) == [], "pool workers outlived the main process"
        if sig != signal.SIGKILL:
            assert proc.returncode == {signal.SIGTERM: 143, signal.SIGINT: 130}[sig]
            assert "rerun the same command to resume" in err and "Traceback" not in err, err
    finally:
        _cleanup(proc, pids)


def test_doubled_check_refuses(tmp_path, fake, capsys):
    proc = _start(tmp_path, "slow", SLOW, "--workers", "2")
    pids = []
    try:
        pids = _pids(tmp_path, 2, proc)
        cid = fake("second", n=2)
        assert main(["check", cid, "--profile", "smoke", "--out", str(tmp_path / "out"), "--workers", "1"]) == 1
        assert "another `kvbounds check` is writing to" in capsys.readouterr().err
        assert ResultStore(tmp_path / "out").load() == []
    finally:
        _cleanup(proc, pids)


def test_torch_in_the_parent_then_workers_with_torch_threads(tmp_path):
    """The real_traces notebook hung: torch's OpenMP pool live in the parent, then forked workers that
    raise torch's thread count deadlock in the OpenMP runtime."""
    pytest.importorskip("torch")
    body = "import torch\ntorch.set_num_threads(2)\nx = torch.randn(600, 600)\nfloat((x @ x).sum())"
    proc = _start(tmp_path, "torch", body, "--workers", "2", "--quiet", torch_first=True)
    try:
        out, err = proc.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        _cleanup(proc)
        pytest.fail("the workers deadlocked")
    assert proc.returncode == 0, err
    assert len(ResultStore(tmp_path / "out").load()) == 12


def test_one_worker_sweep_leaves_the_callers_thread_settings_alone(tmp_path, fake):
    from threadpoolctl import threadpool_info
    import kvbounds.run._workers as workers
    cid = fake("threads", "assert os.environ['OMP_NUM_THREADS'] == '1'", n=2)
    state = lambda: (workers._ONE_THREAD_PROCESS, {v: os.environ.get(v) for v in workers.THREAD_VARS},
                     {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
    before = state()
    assert len(run_checks([cid], profile="smoke", out=tmp_path, workers=1, progress=False)) == 6
    assert ResultStore(tmp_path).errors() == []
    after = state()
    assert after[:2] == before[:2] and {k: after[2][k] for k in before[2]} == before[2]


def test_any_executor_works(tmp_path, fake):
    """run_checks(executor=...) takes any concurrent.futures.Executor (Dask's Client.get_executor() too)."""
    class Inline(cf.Executor):
        def submit(self, fn, *args, **kwargs):
            fut = cf.Future()
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)
            return fut
    cid = fake("inline", 'if params["i"] == 0:\n    raise ZeroDivisionError("x")', n=3)
    seen = []
    written = run_checks([cid], profile="smoke", out=tmp_path, executor=Inline(), progress=False, on_record=seen.append)
    assert len(written) == 6 and seen == written
    assert [e.error for e in ResultStore(tmp_path).errors()] == ["ZeroDivisionError: x"]


def test_eta_comes_from_the_measured_trial_times_of_each_claim():
    """A slow claim's first trial must not scale every other claim's trials (the first ETA read 8h21m for a
    3-minute run): each claim's left trials count at its own measured mean, divided over the workers."""
    todo = [Trial("Slow.x", {"i": i}, 0, "numpy") for i in range(2)] + [Trial("Fast.y", {"i": i}, 0, "numpy")
                                                                         for i in range(100)]
    p = Progress(len(todo), enabled=False, todo=todo, workers=2)
    rec = lambda c, s: [Record(c, {}, 0, "numpy", 0.0, 1.0, True, time_s=s)]
    p.step(todo[0], rec("Slow.x", 60.0))
    assert p.eta() == pytest.approx((60.0 + 100 * 60.0) / 2)          # nothing else measured yet: the median
    p.step(todo[2], rec("Fast.y", 0.1))
    assert p.eta() == pytest.approx((60.0 + 99 * 0.1) / 2)
    line = p.run_line("quick", "numpy", 0)
    assert line["trials"] == 2 and line["cpu_s"] == pytest.approx(60.1) and line["workers"] == 2
    assert line["claims"]["Slow.x"] == {"trials": 1, "wall_s": pytest.approx(60.0, abs=0.5), "cpu_s": 60.0}


def test_a_run_appends_its_wall_and_cpu_time_to_runs_jsonl(tmp_path, fake):
    from kvbounds.core import read_runs
    from kvbounds.report._meta import run_metadata, trial_seconds
    cid = fake("timed", n=3)
    timings = {}
    out = tmp_path / "out"
    recs = run_checks([cid], out=out, workers=1, progress=False, timings=timings)
    (run,) = read_runs(out)
    assert run == timings and run["trials"] == 3 and set(run["claims"]) == {cid} and run["wall_s"] > 0
    per_trial = {r.key: r.time_s for r in recs}                      # 3 records per trial, each with its time
    twice = recs + [dataclasses.replace(r) for r in recs]
    assert len(per_trial) == 3 and trial_seconds(twice) == pytest.approx(sum(per_trial.values()))
    meta = run_metadata(recs, {}, out)
    assert meta["wall_s"] == pytest.approx(run["wall_s"], abs=0.1) and "1 `kvbounds check` run(s)" in meta["duration"]


_TGKILL = {"x86_64": 234, "aarch64": 131}


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine not in _TGKILL,
                    reason="tgkill(2) by its Linux syscall number")
def test_a_ctrl_c_the_kernel_hands_to_another_thread_still_ends_the_run(tmp_path):
    """A process-directed SIGINT may be delivered to any thread that does not block it; delivered to the pool's
    manager or queue-feeder thread, Python runs the handler only when the main thread wakes, and the untimed
    cf.as_completed slept on (the CI hang: main thread in as_completed, 300 s after the Ctrl-C). Here the SIGINT goes
    to a thread other than the main one on purpose: the run still ends within seconds, exit 130, workers gone."""
    import ctypes
    import platform
    proc = _start(tmp_path, "slow", SLOW, "--workers", "2")
    pids = []
    try:
        pids = _pids(tmp_path, 2, proc)
        tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert tids, "the main process has no other thread"
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(_TGKILL[platform.machine()], proc.pid, tids[0], signal.SIGINT) == 0
        t0 = time.monotonic()
        out, err = _communicate(proc)
        assert time.monotonic() - t0 < 60 and proc.returncode == 130, err
        assert _wait_gone(pids) == [], "pool workers outlived the main process"
    finally:
        _cleanup(proc, pids)
