"""`kvbounds check --scheduler`: the trials on a dask.distributed cluster (kvbounds.run._cluster).

One real LocalCluster of two worker processes runs two cheap claims on the smoke profile through the command
line; a worker is killed mid-run. The records equal the local pool's (tests/conftest.py's smoke store), timing
aside; results.jsonl holds every trial once; no trial whose records were written before the kill is computed
again (the scheduler's own transition log says what ran where), and the trials the dead worker held are run
again once. About 10 s on 2 cores (the cluster's start, the killed worker's restart)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from collections import Counter

import pytest

from kvbounds.cli import main
from kvbounds.core._records import RESULTS_FILE, ResultStore, canonical

CLAIMS = ["SG.matprod", "BKV.attention"]      # 9 + 6 smoke trials of 0.01 to 0.4 s


def comparable(records) -> list[str]:
    """Records without their timings (time_s, the only field that differs between executors)."""
    return sorted(canonical({**dataclasses.asdict(r), "time_s": None}) for r in records)


def written_keys(out) -> set[str]:
    path = out / RESULTS_FILE
    if not path.exists():
        return set()
    keys = set()
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            keys.add(json.loads(line).get("key"))
    return keys - {None}


def paced(fn, *args, **kw):
    """A trial that takes 0.2 s longer (smoke trials take milliseconds): the kill then finds one running."""
    time.sleep(0.2)
    return fn(*args, **kw)


def test_parse_scheduler():
    from kvbounds.run._cluster import parse_scheduler
    assert parse_scheduler("local:3") == ("local", 3)
    assert parse_scheduler("tcp://10.0.0.1:8786") == ("address", "tcp://10.0.0.1:8786")
    for bad in ("local:0", "local:x", "local", "", "tcp://a b"):
        with pytest.raises(ValueError):
            parse_scheduler(bad)


def test_scheduler_and_workers_exclude_each_other(tmp_path, capsys):
    assert main(["check", "SBW.balance", "--profile", "smoke", "--scheduler", "local:2", "--workers", "2",
                 "--out", str(tmp_path)]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_bad_scheduler_is_one_line(tmp_path, capsys):
    assert main(["check", "SBW.balance", "--profile", "smoke", "--scheduler", "local:0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "local:N" in err, err


def test_unreachable_scheduler_is_one_line(tmp_path, capsys, monkeypatch):
    distributed = pytest.importorskip("distributed")

    def refuse(address, **kw):
        raise OSError(f"Timed out trying to connect to {address}")
    monkeypatch.setattr(distributed, "Client", refuse)
    assert main(["check", "SBW.balance", "--profile", "smoke", "--scheduler", "tcp://127.0.0.1:9", "--out",
                 str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbounds: cannot reach the dask scheduler at tcp://127.0.0.1:9") and err.count("\n") == 1


def test_workers_with_several_threads_are_refused(tmp_path, capsys):
    """A trial's BLAS/torch thread limits are per process: two trials in one worker process would change each
    other's, so a scheduler whose workers run 2 threads is refused before any trial runs."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as lc:
        assert main(["check", "SBW.balance", "--profile", "smoke", "--scheduler", lc.scheduler_address, "--out",
                     str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "run [2] threads each" in err and "--nthreads 1" in err, err
    assert not (tmp_path / RESULTS_FILE).exists()


def test_local_cluster_equals_the_local_pool_and_survives_a_killed_worker(tmp_path, smoke_store, monkeypatch):
    distributed = pytest.importorskip("distributed")
    from kvbounds import run as cluster         # the runner reads dask_executor from the run room's face
    out = tmp_path / "res"
    seen: dict = {"trial_of": {}}          # dask key -> trial key, as the runner submits them
    real = cluster.dask_executor

    def kill_a_busy_worker(client, done):
        """After three trials are written (and their futures released), SIGKILL a worker that is running one (the
        one holding the most results, had any been kept)."""
        while len(written_keys(out)) < 3 and not done.is_set():
            time.sleep(0.02)
        seen["written"] = written_keys(out)
        time.sleep(0.1)                              # the released futures reach the scheduler
        held = client.has_what()                     # results in the workers' memory
        seen["held"] = {k for ks in held.values() for k in ks}
        busy = {w: ks for w, ks in client.processing().items() if ks}
        if done.is_set() or not busy:
            return
        victim = max(busy, key=lambda w: len(held.get(w, ())))
        pid = client.run(os.getpid, workers=[victim])[victim]
        seen["in_flight"] = set(busy[victim])
        os.kill(pid, signal.SIGKILL)
        seen["killed_at"] = time.time()

    @contextlib.contextmanager
    def spy(spec):
        with real(spec) as (executor, workers):
            client = distributed.default_client()
            submit = client.submit

            def recording_submit(fn, *args, **kw):
                fut = submit(paced, fn, *args, **kw)
                seen["trial_of"][fut.key] = args[0].key
                return fut
            monkeypatch.setattr(client, "submit", recording_submit)
            done = threading.Event()
            killer = threading.Thread(target=kill_a_busy_worker, args=(client, done), daemon=True)
            killer.start()
            try:
                yield executor, workers
            finally:
                done.set()
                killer.join()
                seen["log"] = list(client.cluster.scheduler.transition_log)

    monkeypatch.setattr(cluster, "dask_executor", spy)
    assert main(["check", *CLAIMS, "--profile", "smoke", "--scheduler", "local:2", "--out", str(out), "--quiet"]) == 0

    store = ResultStore(out)
    assert not store.errors()
    lines = [json.loads(line) for line in (out / RESULTS_FILE).read_text().splitlines()]
    assert len(lines) == len({(d["key"], canonical(d["params"]), repr(d["measured"]), d["check"]) for d in lines}), \
        "a record written twice"
    local = [r for c in CLAIMS for r in smoke_store.records(c)]
    assert comparable(store.load()) == comparable(local)

    assert "killed_at" in seen, "no worker was busy after three trials: nothing was killed"
    finished = Counter(t.key for t in seen["log"] if t.start == "processing" and t.finish == "memory")
    started = Counter(t.key for t in seen["log"] if t.finish == "processing")
    trial_of = seen["trial_of"]
    assert not {trial_of[k] for k in seen["held"]} & seen["written"], "the cluster held results already written"
    assert set(finished) == set(trial_of)                        # every submitted trial ran
    recomputed = {trial_of[k] for k in finished if finished[k] > 1}
    assert not recomputed & seen["written"], "a trial written before the kill was computed again"
    assert max(started.values()) <= 2                           # a trial on the dead worker is run again once
    assert all(started[k] == 2 for k in seen["in_flight"]), (seen["in_flight"], started)
