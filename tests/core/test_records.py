import json
import math

import pytest

from kvbounds.core import Record, ResultStore, trial_key


def _rec(i=0, **kw):
    base = dict(claim="SBW.balance", params={"n": 4 + i}, seed=0, backend="numpy", measured=1.0, bound=2.0, holds=True)
    base.update(kw)
    return Record(**base)


def test_roundtrip_and_ratio(tmp_path):
    st = ResultStore(tmp_path)
    st.append([_rec(0), _rec(1, measured=math.inf, holds=False)])
    out = st.load()
    assert [r.params["n"] for r in out] == [4, 5]
    assert out[0].ratio == 0.5 and out[1].measured == math.inf and out[1].ratio == math.inf


def test_truncated_line_is_skipped_and_next_append_starts_fresh_line(tmp_path):
    st = ResultStore(tmp_path)
    st.append([_rec(0)])
    with open(st.path, "a") as fh:
        fh.write(_rec(1).to_json()[:30])     # a crash mid-write
    assert len(st.load()) == 1
    st.append([_rec(2)])
    assert [r.params["n"] for r in st.load()] == [4, 6]
    for line in st.path.read_text().splitlines()[-1:]:
        json.loads(line)


def test_bad_bound_kind():
    with pytest.raises(ValueError, match="bound_kind"):
        _rec(0, bound_kind="vibes")


def test_trial_key_depends_on_everything():
    k = trial_key("A", {"n": 1}, 0, "numpy")
    assert k != trial_key("A", {"n": 2}, 0, "numpy") != trial_key("A", {"n": 1}, 1, "numpy")
    assert k == trial_key("A", {"n": 1}, 0, "numpy")


# ------------------------------------------------------------------ lines that are not records

NOT_RECORDS = [b"123", b"null", b"{}", b"[1, 2]", b'"text"', b"\xff\xfe not utf-8", b"[" * 100000,
               b'{"claim": "SBW.balance", "params": {}, "seed": 0, "backend": "numpy", "measured": "abc", "bound": 1, "holds": true}',
               b'{"claim": "SBW.balance", "params": {}, "seed": 0, "backend": "numpy", "measured": 1, "bound": 1, "holds": "yes"}',
               b'{"claim": 5, "params": {}, "seed": 0, "backend": "numpy", "measured": 1, "bound": 1, "holds": true}',
               b'{"claim": "SBW.balance", "params": {}, "seed": 0, "backend": "numpy", "measured": 1, "bound": 1, "holds": true, "bound_kind": "vibes"}',
               # issue 43: integers beyond float range (one such line made the whole store unreadable: OverflowError)
               b'{"claim": "SBW.balance", "params": {}, "seed": 0, "backend": "numpy", "measured": 1' + b"0" * 400
               + b', "bound": 1, "holds": true}',
               b'{"claim": "SBW.balance", "params": {}, "seed": 0, "backend": "numpy", "measured": 1, "bound": -'
               + b"9" * 400 + b', "holds": true}',
               b'{"claim": "SBW.balance", "params": {}, "seed": 0, "backend": "numpy", "measured": 1, "bound": 1, '
               b'"holds": true, "time_s": 1' + b"0" * 400 + b'}',
               b'{"claim": "SBW.balance", "params": {}, "seed": 0, "backend": "numpy", "measured": 1' + b"0" * 5000
               + b', "bound": 1, "holds": true}']


def test_lines_that_are_not_records_are_skipped_with_one_warning(tmp_path, caplog):
    st = ResultStore(tmp_path)
    st.append([_rec(0)])
    with open(st.path, "ab") as fh:
        fh.write(b"\n".join(NOT_RECORDS) + b"\n")
    st.append([_rec(1)])
    with caplog.at_level("WARNING", logger="kvbounds"):
        assert [r.params["n"] for r in st.load()] == [4, 5]
        assert [r.params["n"] for r in st.load()] == [4, 5]
    (msg,) = [r.getMessage() for r in caplog.records]
    assert f"skipped {len(NOT_RECORDS)} line(s) that are not records (first: line 2: not a record: a JSON int)" in msg


def test_cli_survives_lines_that_are_not_records(tmp_path, capsys, caplog):
    from kvbounds.cli import main
    (tmp_path / "results.jsonl").write_bytes(b"\n".join(NOT_RECORDS) + b"\n")
    with caplog.at_level("WARNING", logger="kvbounds"):
        assert main(["check", "MR.error", "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 0
        assert main(["list", "--out", str(tmp_path)]) == 0
        assert main(["report", "--out", str(tmp_path)]) == 0
    assert len([r for r in caplog.records if "not records" in r.getMessage()]) == 1
    assert "MR.error" in capsys.readouterr().out
    assert {r.claim for r in ResultStore(tmp_path).load()} == {"MR.error"}


# ----------------------------------------------------------------------- trials, all or nothing

def _trial(key, n, **kw):
    return [_rec(i, key=key, extra={"trial_size": n}, **kw) for i in range(n)]


def test_a_trial_is_kept_all_or_nothing_and_never_twice(tmp_path, caplog):
    st = ResultStore(tmp_path)
    st.append(_trial("k1", 3))
    st.append(_trial("k2", 3))
    data = st.path.read_bytes()
    st.path.write_bytes(data[:len(data) - 30])            # the last line of k2 cut short
    assert {r.key for r in st.load()} == {"k1"} and st.done_keys() == {"k1"}
    st.append(_trial("k2", 3))                              # the rerun
    st.append(_trial("k1", 3))                              # a second writer (no lock) repeats k1
    with caplog.at_level("WARNING", logger="kvbounds"):
        recs = st.load()
    assert [r.key for r in recs] == ["k1"] * 3 + ["k2"] * 3
    c = st.read()
    assert (c.unreadable, c.partial_trials, c.duplicate_trials) == (1, 1, 1)
    assert "1 partly written trial(s)" in caplog.text and "1 duplicate run(s)" in caplog.text


def test_untagged_lines_of_older_files_group_by_trial(tmp_path):
    st = ResultStore(tmp_path)
    lines = [r.to_json() for r in _trial("old1", 2) + _trial("old2", 3)[:2]]   # old2 lost its last record
    st.path.write_text("\n".join(lines) + "\n")
    assert [r.key for r in st.load()] == ["old1", "old1"] and st.done_keys() == {"old1"}


def test_error_records_are_apart_and_superseded_by_a_success(tmp_path):
    st = ResultStore(tmp_path)
    st.append([Record.failed("SBW.balance", {"n": 4}, 0, "numpy", "ValueError: first", "  File x")])
    bad = Record.failed("SBW.balance", {"n": 4}, 0, "numpy", "ValueError: again")
    bad.key = "k"
    st.append([bad])
    assert st.load() == [] and st.done_keys() == set()
    errs = st.errors()
    assert [e.error for e in errs] == ["ValueError: first", "ValueError: again"] and all(e.is_error for e in errs)
    assert math.isnan(errs[0].measured) and errs[0].extra["traceback"] == "  File x"
    st.append(_trial("k", 1))                                # the retry succeeds
    assert [e.error for e in st.errors()] == ["ValueError: first"]
    assert [r.key for r in st.load()] == ["k"]


def test_write_loops_over_short_writes_and_reports_a_full_disk(tmp_path, monkeypatch):
    import errno
    import os
    from kvbounds.core import StoreError
    st = ResultStore(tmp_path)
    st.append(_trial("ok", 2))
    real_write = os.write
    with monkeypatch.context() as m:
        m.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:5])))
        st.append(_trial("short", 4))
    with monkeypatch.context() as m:
        def full(fd, data):
            real_write(fd, bytes(data[:50]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        m.setattr(os, "write", full)
        with pytest.raises(StoreError, match="No space left on device"):
            st.append(_trial("full", 2))
    assert st.done_keys() == {"ok", "short"} and st.read().partial_trials == 0   # the failed write was cut off
    st.append(_trial("full", 2))
    assert [r.key for r in st.load()].count("full") == 2


def test_records_from_before_papers_were_named_load_and_summarize_like_new_ones(tmp_path):
    """Records written before issue 25 cite the papers by seed label ("001 shape", "004 Sec. 8"): they load with
    the papers' short names and give the same verdict as the same records written today."""
    from kvbounds.report._report import build_verdicts, summary_json
    new = [Record("BKV.attention", {"t": t, "d": 4, "r": 1.0, "sweep": "t"}, 0, "numpy", 0.01 * t ** -0.5, 1.0 / t,
                  True, bound_kind="shape", check=f"{paper} shape", source=src, extra={"proof_step": ""})
           for t in (8, 16, 32, 64) for paper, src in (("BalanceKV-NeurIPS", "BalanceKV-NeurIPS Thm 3.1, Alg. 1"),
                                                       ("BalanceKV-preprint", "BalanceKV-preprint thm:main-theorem"))]
    ResultStore(tmp_path / "new").append(new)
    old = tmp_path / "old" / "results.jsonl"
    old.parent.mkdir()
    legacy = {"BalanceKV-NeurIPS": "001", "BalanceKV-preprint": "000"}
    with old.open("w") as f:
        for r in new:
            d = json.loads(r.to_json())
            for name, label in legacy.items():
                d["check"], d["source"] = d["check"].replace(name, label), d["source"].replace(name, label)
            f.write(json.dumps(d) + "\n")
        f.write(json.dumps(dict(json.loads(_rec(0).to_json()), claim="FD.residual", check="memory 001",
                                source="004 Sec. 8", extra={"proof_step": "001 A.1 eq. (3)", "note": "0.001 s"},
                                key="k-fd")) + "\n")
    assert '"check": "001 shape"' in old.read_text() and '"source": "004 Sec. 8"' in old.read_text()
    loaded = ResultStore(old.parent).load()
    assert [r.check for r in loaded[:2]] == ["BalanceKV-NeurIPS shape", "BalanceKV-preprint shape"]
    fd = loaded[-1]
    assert (fd.check, fd.source) == ("memory BalanceKV-NeurIPS", "Subspace-FD-draft Sec. 8")
    assert fd.extra == {"proof_step": "BalanceKV-NeurIPS A.1 eq. (3)", "note": "0.001 s"}
    v = build_verdicts(loaded[:-1], ["BKV.attention"])["BKV.attention"]
    assert v.statement == "holds-fitted" and "[BalanceKV-NeurIPS shape] fitted constant" in v.summary
    assert summary_json(build_verdicts(loaded[:-1], ["BKV.attention"])) == \
        summary_json(build_verdicts(ResultStore(tmp_path / "new").load(), ["BKV.attention"]))


def test_a_record_with_a_non_finite_time_reads_back(tmp_path):
    """jsonable writes a NaN or infinite time_s as 'nan' / 'inf' (as it writes measured and bound); reading converted
    only measured and bound, so such a record was skipped on read: a lost record."""
    store = ResultStore(tmp_path)
    store.append([Record("X", {"n": 1}, 0, "numpy", 1.0, 2.0, True, time_s=math.nan),
                  Record("X", {"n": 2}, 0, "numpy", 1.0, 2.0, True, time_s=math.inf)])
    got = ResultStore(tmp_path).load()
    assert len(got) == 2 and math.isnan(got[0].time_s) and got[1].time_s == math.inf
