"""Progress of a sweep and what it cost: the ETA from the trial times measured so far, the wall and CPU time of
each claim's check, and one line per ``kvbounds check`` in ``DIR/runs.jsonl`` (the report's Run section)."""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from ._records import RUNS_FILE, Record, canonical


def duration(s: float) -> str:
    if not math.isfinite(s):
        return "unknown"
    s = max(s, 0.0)
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(int(round(s)), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def trial_time(recs: Sequence[Record]) -> float:
    """Seconds one trial took (its records each carry the trial's time; a check may set a smaller one)."""
    return max((r.time_s for r in recs), default=0.0)


class ClaimTime:
    """One claim's share of a run: trials finished, seconds summed over its trials (CPU time: one thread per
    trial), and the wall-clock span from its first trial's start to its last trial's end, as the main process
    sees them finish (the run line takes at least the trials' seconds over the workers)."""

    def __init__(self):
        self.trials, self.cpu_s, self.start, self.end = 0, 0.0, float("inf"), 0.0

    def add(self, seconds: float, finished: float) -> None:
        self.trials += 1
        self.cpu_s += seconds
        self.start, self.end = min(self.start, finished - seconds), max(self.end, finished)

    @property
    def wall_s(self) -> float:
        return max(self.end - self.start, 0.0) if self.trials else 0.0


class Progress:
    """A tqdm bar when the stream is a terminal; otherwise one plain line per finished trial
    (``[done/total] claim  elapsed ..., eta ...``). Failed trials are announced on their own line.

    The ETA is the measured mean trial time of each claim times its trials left, summed and divided by the
    workers; a claim with no trial finished yet counts at the median of the trial times measured so far."""

    def __init__(self, total: int, stream=None, enabled: bool = True, *, todo: Sequence = (), workers: int = 1):
        self.total, self.done, self.errors, self.enabled = total, 0, 0, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.perf_counter()
        self.workers = max(int(workers or 1), 1)
        self.left = Counter(t.claim for t in todo)
        self.claims: dict[str, ClaimTime] = {}
        self.bar = None
        if enabled and total and getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm
            self.bar = tqdm(total=total, file=self.stream, unit="trial", leave=True)

    def note(self, msg: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(msg, file=self.stream)
        else:
            self.stream.write(msg + "\n")
            self.stream.flush()

    def eta(self) -> float:
        """Seconds left by the trial times measured so far (see the class doc); 0 when none is measured."""
        times = {c: t.cpu_s / t.trials for c, t in self.claims.items() if t.trials}
        if not times:
            return 0.0
        median = statistics.median(times.values())
        left = sum(n * times.get(c, median) for c, n in self.left.items() if n > 0)
        return left / min(self.workers, max(sum(n for n in self.left.values() if n > 0), 1))

    def step(self, trial, recs: Sequence[Record]) -> None:
        self.done += 1
        self.left[trial.claim] -= 1
        self.claims.setdefault(trial.claim, ClaimTime()).add(trial_time(recs), time.perf_counter())
        failed = [r for r in recs if r.is_error]
        if failed:
            self.errors += 1
            self.note(f"kvbounds: {trial.claim} {canonical(trial.params)} failed: {failed[0].error} "
                      "(stored as an error record; the sweep goes on)")
        if self.bar is not None:
            self.bar.set_postfix_str(trial.claim, refresh=False)
            self.bar.update(1)
        elif self.enabled:
            el = time.perf_counter() - self.t0
            errs = f", {self.errors} failed" if self.errors else ""
            self.note(f"[{self.done:>4}/{self.total}] {trial.claim:<24} elapsed {duration(el)}, "
                      f"eta {duration(self.eta())}{errs}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def run_line(self, profile: str = "", backend: str = "", seed: int = 0) -> dict:
        """This run as one line of ``runs.jsonl``."""
        return {"finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "profile": profile,
                "backend": backend, "seed": seed, "workers": self.workers, "trials": self.done,
                "wall_s": round(time.perf_counter() - self.t0, 3),
                "cpu_s": round(sum(t.cpu_s for t in self.claims.values()), 3),
                "claims": {c: {"trials": t.trials, "wall_s": round(max(t.wall_s, t.cpu_s / self.workers), 3),
                               "cpu_s": round(t.cpu_s, 3)} for c, t in self.claims.items()}}


def append_run(out_dir: str | os.PathLike, line: dict) -> None:
    """Best effort: the run's line in ``DIR/runs.jsonl`` (the records stay valid without it); none when runs.jsonl is
    a link onto another file of the store (the records)."""
    from ._output_files import OutputRefused, check_output
    try:
        check_output(Path(out_dir) / RUNS_FILE, own=True)
        with open(Path(out_dir) / RUNS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
    except (OSError, OutputRefused):
        pass


def read_runs(out_dir: str | os.PathLike) -> list[dict]:
    """The lines of ``DIR/runs.jsonl`` that parse (one per ``kvbounds check`` that ran trials); none when it is no
    regular file (a FIFO is never opened: a read would block)."""
    from ._output_files import special_file
    path = Path(out_dir) / RUNS_FILE
    try:
        if special_file(path):
            return []
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    runs = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("wall_s"), (int, float)):
            runs.append(d)
    return runs
