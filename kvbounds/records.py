"""Records: what a check returns, and the append-only store that holds them.

A record is one trial of one claim check: the parameters, the seed and backend that produced it,
the measured statistic, the bound it is compared against, their ratio and a verdict. Every consumer
(report, notebooks, tests) reads records; nothing is printed and forgotten.

Two kinds of bound are kept apart by ``bound_kind``:
  * ``"a-priori"``    the paper's bound as a function of the parameters (constants proven),
  * ``"fitted"``      an O(.) shape times a constant fitted from our sweeps,
  * ``"certificate"`` a bound the algorithm computes from its own state,
  * ``"exact"``       an identity (measured is an error that must be ~0, bound is a tolerance).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

BOUND_KINDS = ("a-priori", "fitted", "certificate", "exact", "shape")
RESULTS_FILE = "results.jsonl"


def _jsonable(x: Any) -> Any:
    """Convert numpy scalars/arrays and tuples to plain JSON types; non-finite floats to strings."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist"):  # numpy scalar or array
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)  # 'inf', 'nan': JSON has no literal for them
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    return str(x)


def canonical(obj: Any) -> str:
    return json.dumps(_jsonable(obj), sort_keys=True, separators=(",", ":"))


def trial_key(claim: str, params: dict, seed: int, backend: str) -> str:
    """Identity of a trial: a finished trial with the same key is never recomputed."""
    return hashlib.sha256(canonical([claim, params, seed, backend]).encode()).hexdigest()[:20]


@dataclasses.dataclass
class Record:
    claim: str
    params: dict
    seed: int
    backend: str
    measured: float
    bound: float
    holds: bool
    bound_kind: str = "a-priori"
    check: str = ""          # sub-check name within the claim (e.g. "walk", "random-signs")
    control: bool = False    # negative control: a correct check must reject it (holds=False)
    source: str = ""         # seed/theorem the bound is taken from, e.g. "001 Thm 3.3"
    trials: int = 1
    time_s: float = 0.0
    extra: dict = dataclasses.field(default_factory=dict)
    key: str = ""

    def __post_init__(self):
        if self.bound_kind not in BOUND_KINDS:
            raise ValueError(f"bound_kind must be one of {BOUND_KINDS}, got {self.bound_kind!r}")
        self.measured = float(self.measured)
        self.bound = float(self.bound)
        self.holds = bool(self.holds)

    @property
    def ratio(self) -> float:
        if self.bound == 0:
            return 0.0 if self.measured == 0 else math.inf
        return self.measured / self.bound

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["ratio"] = self.ratio
        return canonical(d)

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        d = dict(d)
        d.pop("ratio", None)
        for f in ("measured", "bound"):
            if isinstance(d.get(f), str):
                d[f] = float(d[f])
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class ResultStore:
    """Append-only JSON-lines store in ``DIR/results.jsonl``.

    Each record is written with one ``os.write`` on an ``O_APPEND`` descriptor and fsynced, so a
    crash leaves at most one truncated last line; ``load`` skips such a line, and ``append``
    starts a fresh line after it.
    """

    def __init__(self, out_dir: str | os.PathLike):
        self.dir = Path(out_dir)
        self.path = self.dir / RESULTS_FILE

    def _iter_raw(self) -> Iterator[dict]:
        if not self.path.exists():
            return
        with open(self.path, "r", encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue  # a half-written line from an interrupted run

    def load(self) -> list[Record]:
        return [Record.from_dict(d) for d in self._iter_raw()]

    def done_keys(self) -> set[str]:
        return {d.get("key", "") for d in self._iter_raw()}

    def append(self, records: Iterable[Record]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        payload = "".join(r.to_json() + "\n" for r in records)
        if not payload:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size > 0:
                with open(self.path, "rb") as fh:
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        payload = "\n" + payload
            os.write(fd, payload.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
