"""The report's inputs besides the verdicts: records of trials that raised, the end-to-end leaderboard's rows,
and the run's metadata (package version, git commit, profile, seeds, backends, duration)."""
from __future__ import annotations

import importlib
import itertools
import json
import subprocess
import time
from pathlib import Path
from typing import Sequence

from kvbounds import __version__
from kvbounds import claims as registry
from kvbounds.algorithms.validation import check_int
from kvbounds.core import Record, canonical
from ._words import check_text
from kvbounds.verdict import Verdict
from kvbounds.core import trial_key
from kvbounds.core import duration, read_runs


def one_line(s: str, n: int) -> str:
    """``s`` on one line, papers named, cut to ``n`` characters with an ellipsis."""
    check_text(s)
    check_int(n, "n", minimum=1)
    s = " ".join(registry.cite(s).split())
    return s if len(s) <= n else s[: n - 1] + "\u2026"


def _field(obj, name, default=""):
    return obj.get(name, default) if isinstance(obj, dict) else getattr(obj, name, default)


def error_rows(errors: Sequence) -> list[dict]:
    rows = []
    for e in errors:
        msg = _field(e, "error") or _field(e, "message") or _field(e, "exception")
        tb = _field(e, "traceback")
        rows.append({"claim": _field(e, "claim"), "params": canonical(_field(e, "params", {})),
                     "seed": _field(e, "seed"), "backend": _field(e, "backend"),
                     "error": one_line(str(msg), 160), "detail": str(tb or msg)})
    return rows


def leaderboard(records: Sequence[Record]) -> list[dict] | None:
    """Rows of the end-to-end leaderboard, when ``kvbounds.e2e._leaderboard`` is installed."""
    try:
        mod = importlib.import_module("kvbounds.e2e._leaderboard")
    except ImportError:
        return None
    fn = getattr(mod, "leaderboard_rows", None)
    if fn is None:
        return None
    try:
        rows = list(fn(records))
    except Exception:  # noqa: BLE001
        return None
    return rows or None


def git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + (" (uncommitted changes)" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def infer_profile(records: Sequence[Record]) -> str:
    """The smallest profile whose trials produced every record (records store their trial's key, not the
    profile): a record's key is one of the profile's trial keys for its claim, seed and backend."""
    from kvbounds.run import PROFILES, profile_trials
    runs = {(r.claim, r.seed, r.backend) for r in records if r.claim in registry.CLAIMS}
    keys = {r.key for r in records if r.claim in registry.CLAIMS}
    if not keys:
        return "unknown"
    covered: dict[str, set] = {}
    for prof in PROFILES:
        covered[prof] = set()
        for cid, seed, backend in runs:
            try:
                mod = registry.CLAIMS[cid].check_module()
                covered[prof] |= {trial_key(cid, dict(p), seed, backend) for p in (profile_trials(mod, prof) if mod else [])}
            except Exception:  # noqa: BLE001
                pass
    for size in range(1, len(PROFILES) + 1):          # the fewest profiles whose trials cover every record
        for combo in itertools.combinations(PROFILES, size):
            if keys <= set().union(*(covered[p] for p in combo)):
                return " + ".join(combo)
    used = [p for p in PROFILES if keys & covered[p]]
    return " + ".join(used) if used else "unknown"


def trial_seconds(records: Sequence[Record]) -> float:
    """Seconds summed over trials (CPU time: one thread per trial): each trial once, however many records it wrote."""
    by_trial: dict[str, float] = {}
    for r in records:
        k = r.key or str(id(r))
        by_trial[k] = max(by_trial.get(k, 0.0), r.time_s or 0.0)
    return sum(by_trial.values())


def run_metadata(records: Sequence[Record], verdicts: dict[str, Verdict], out_dir: Path) -> dict:
    """Package, profile, seeds, backends; the wall time of the runs that wrote ``out_dir`` (from its
    ``runs.jsonl``, one line per ``kvbounds check``) and the CPU time summed over the trials of the records."""
    runs = read_runs(out_dir)
    run_file = out_dir / "run.json"       # older layout: one run's duration_s
    if not runs and run_file.exists():
        try:
            old = json.loads(run_file.read_text())
            runs = [{"wall_s": float(old["duration_s"]), "profile": old.get("profile", "")}] if "duration_s" in old else []
        except (OSError, ValueError, TypeError):
            runs = []
    wall = sum(r["wall_s"] for r in runs)
    workers = sorted({r["workers"] for r in runs if isinstance(r.get("workers"), int)})
    cpu = trial_seconds(records)
    profiles = list(dict.fromkeys(r.get("profile") for r in runs if r.get("profile")))
    return {
        "version": __version__, "commit": git_commit(),
        "profile": infer_profile(records) if records else (" + ".join(profiles) or "unknown"),
        "seeds": ", ".join(map(str, sorted({r.seed for r in records}))) or "-",
        "backends": ", ".join(sorted({r.backend for r in records})) or "-",
        "records": len(records), "claims": len(verdicts),
        "duration": (f"{duration(wall)} wall clock over {len(runs)} `kvbounds check` run(s)"
                     + (f" on {'/'.join(map(str, workers))} worker(s)" if workers else "")) if runs else "",
        "wall_s": round(wall, 1) if runs else None, "cpu_s": round(cpu, 1),
        "trial_time": f"{duration(cpu)} CPU time summed over the {len({r.key or id(r) for r in records})} trials "
                      "of these records (one thread per trial)",
        "generated": time.strftime("%Y-%m-%d %H:%M %Z"),
        "orphans": ", ".join(sorted({r.claim for r in records} - set(registry.CLAIMS))),
    }
