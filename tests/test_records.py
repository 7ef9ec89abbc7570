import json
import math

import pytest

from kvbounds.records import Record, ResultStore, trial_key


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
