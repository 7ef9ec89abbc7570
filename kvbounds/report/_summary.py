"""What the report says once: each finding once with the claims it concerns (:func:`unique_findings`), and
``summary.json`` (:func:`summary_json`): every verdict field but the figures, papers named, plus the unique
findings, the per-paper answers (``"papers"``, :mod:`kvbounds.report`) and, when the report has the records,
the practitioner's table (``"practitioner"``, :mod:`kvbounds.report`), the end-to-end leaderboard's rows
(``"leaderboard"``) and the run's metadata (``"run"``): everything ``docs/RESULTS.md`` and the README's "What we
found" are rendered from (:mod:`kvbounds.report.summary_read`). Re-exported by :mod:`kvbounds.report`."""
from __future__ import annotations

import dataclasses
import json
from collections import defaultdict

from kvbounds import claims as registry
from kvbounds.core import jsonable, canonical
from ._words import check_verdicts
from kvbounds.verdict import Verdict


def unique_findings(verdicts: dict[str, Verdict]) -> list[dict]:
    """Each finding once (papers named, see ``registry.cite``), with the claims it concerns, in registry order:
    a finding that several checks report (BalanceKV-NeurIPS App. B vs the released code, under BKV.vs-uniform
    and BKV.ablation) is one finding attached to each of them. Ids ``F1``, ``F2``, ... follow that order."""
    check_verdicts(verdicts)
    out: dict[tuple, dict] = {}
    for cid, v in verdicts.items():
        for f in v.findings:
            title, detail = registry.cite(f.title), registry.cite(f.detail)
            key = (f.kind or "finding", title, detail, canonical(f.smallest_input or {}))
            if key not in out:
                out[key] = {"id": f"F{len(out) + 1}", "kind": key[0], "title": title, "detail": detail,
                            "smallest_input": jsonable(f.smallest_input or {}), "claims": []}
            if (f.claim or cid) not in out[key]["claims"]:
                out[key]["claims"].append(f.claim or cid)
    return list(out.values())


def group_by_kind(findings: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list] = defaultdict(list)
    for f in findings:
        groups[f["kind"]].append(f)
    return dict(sorted(groups.items()))


# the keys of summary.json that are not claim ids
SUMMARY_KEYS = ("findings", "papers", "practitioner", "leaderboard", "run")
# the run's metadata kept in summary.json (not the time it was generated: the same records give the same bytes)
RUN_KEYS = ("version", "commit", "profile", "seeds", "backends", "records", "claims", "duration", "wall_s", "cpu_s",
            "trial_time")


def summary_extras(records, verdicts: dict[str, Verdict], meta: dict, board: list[dict] | None) -> dict:
    """The parts of summary.json read from the records besides the verdicts: the practitioner's table, the
    leaderboard's rows and the run's metadata (:data:`RUN_KEYS`)."""
    from ._practitioner import practitioner_table
    try:
        from kvbounds.e2e import timing_rows
        timing = timing_rows(records)
    except (ImportError, AttributeError):     # the end-to-end harness is not installed: no timing
        timing = []
    return {"practitioner": practitioner_table(board, verdicts, timing), "leaderboard": board or [],
            "run": {k: meta.get(k) for k in RUN_KEYS}}


def summary_dict(verdicts: dict[str, Verdict], extras: dict | None = None) -> dict:
    """Per claim id, every Verdict field but the figures, JSON-ready (non-finite floats as strings), the papers
    named (``registry.cite``) and each finding with its id; under the key ``"findings"`` the unique findings
    (:func:`unique_findings`: id, kind, title, detail, smallest input, the claims each concerns)."""
    unique = unique_findings(verdicts)
    ids = {(f["kind"], f["title"], f["detail"], canonical(f["smallest_input"])): f["id"] for f in unique}
    out = {}
    for cid, v in verdicts.items():
        d = dataclasses.asdict(v)
        d.pop("figures", None)
        d = _named(jsonable(d))
        for f in d["findings"]:
            f["id"] = ids.get((f["kind"] or "finding", f["title"], f["detail"], canonical(f["smallest_input"] or {})), "")
        out[cid] = d
    out["findings"] = unique
    from ._paper_answers import paper_answers
    out["papers"] = paper_answers(verdicts)
    out.update(jsonable(extras or {}))
    return out


def _named(x):
    """Every string of a JSON-ready value with the papers named (keys and parameter values left alone)."""
    if isinstance(x, dict):
        return {k: (v if k in ("params", "smallest_input") else _named(v)) for k, v in x.items()}
    if isinstance(x, list):
        return [_named(v) for v in x]
    return registry.cite(x) if isinstance(x, str) else x


def summary_json(verdicts: dict[str, Verdict], extras: dict | None = None) -> str:
    """Deterministic: the same records give the same bytes (keys sorted, no timestamp)."""
    return json.dumps(summary_dict(verdicts, extras), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
