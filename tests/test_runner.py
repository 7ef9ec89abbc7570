import concurrent.futures as cf

import pytest

from kvbounds.records import ResultStore
from kvbounds.registry import CLAIMS, get_claim
from kvbounds.runner import expand, run_checks, trial_seed


def test_registry_covers_catalogue_ids():
    assert len(CLAIMS) == 28 and "SBW.balance" in CLAIMS and "BKV.e2e" in CLAIMS
    with pytest.raises(KeyError, match="unknown claim"):
        get_claim("NOPE.x")


def test_resume_skips_finished_trials(tmp_path):
    ex = cf.ThreadPoolExecutor(1)
    first = run_checks(["SBW.balance"], profile="smoke", out=tmp_path, executor=ex, progress=False)
    assert first and all(r.key for r in first)
    again = run_checks(["SBW.balance"], profile="smoke", out=tmp_path, executor=ex, progress=False)
    assert again == []
    assert len(ResultStore(tmp_path).load()) == len(first)


def test_interrupted_trial_is_rerun(tmp_path):
    ex = cf.ThreadPoolExecutor(1)
    first = run_checks(["SBW.balance"], profile="smoke", out=tmp_path, executor=ex, progress=False)
    st = ResultStore(tmp_path)
    lines = st.path.read_text().splitlines()
    st.path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])   # last record half-written
    redo = run_checks(["SBW.balance"], profile="smoke", out=tmp_path, executor=ex, progress=False)
    assert len(redo) == first[-1].extra["trial_size"] or len(redo) >= 1


def test_trial_seed_is_backend_independent():
    assert trial_seed(0, "X", {"n": 1}) == trial_seed(0, "X", {"n": 1}) != trial_seed(1, "X", {"n": 1})


def test_bad_profile_and_backend(tmp_path):
    with pytest.raises(ValueError, match="profile"):
        expand([get_claim("SBW.balance")], "huge", 0, "numpy")
    with pytest.raises(ValueError, match="unknown backend"):
        run_checks(["SBW.balance"], backend="tpu", out=tmp_path, progress=False)
