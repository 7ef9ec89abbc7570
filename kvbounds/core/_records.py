"""Records: what a check returns, and the append-only store that holds them.

A record is one trial of one claim check: the parameters, the seed and backend that produced it,
the measured statistic, the bound it is compared against, their ratio and a verdict. Every consumer
(report, notebooks, tests) reads records; nothing is printed and forgotten.

Two kinds of bound are kept apart by ``bound_kind``:
  * ``"a-priori"``    the paper's bound as a function of the parameters (constants proven),
  * ``"fitted"``      an O(.) shape times a constant fitted from our sweeps,
  * ``"certificate"`` a bound the algorithm computes from its own state,
  * ``"exact"``       an identity (measured is an error that must be ~0, bound is a tolerance).

A trial that raised is stored as an *error record*: ``error`` holds ``"ExceptionType: message"``,
``extra["traceback"]`` the last frames, ``measured``/``bound`` are NaN and ``holds`` is False. Error
records never count as bound violations: ``ResultStore.load()`` leaves them out, ``ResultStore.errors()``
lists them (only those of trials with no successful run since), and ``check`` retries those trials.
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import math
import os
import stat
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable
from kvbounds.claims import cite

BOUND_KINDS = ("a-priori", "fitted", "certificate", "exact", "shape")
RESULTS_FILE = "results.jsonl"
LOCK_FILE = ".kvbounds.lock"
RUNS_FILE = "runs.jsonl"                      # one line per `kvbounds check` (kvbounds.core._progress)
REPORT_FILES = ("report.html", "summary.json")
FIGURES_DIR = "figures"                       # the report's figures/*.png
STORE_FILE = ".kvbounds.store"                # which command writes the store: the other command refuses it
# the commands that write a store, by the name its marker holds: `kvbounds e2e` writes claim records, as `check` does
WRITERS = {"check": "`kvbounds check`", "evaluate": "`kvbounds evaluate`"}
EVALUATE_CLAIM = "evaluate"                   # the claim of `kvbounds evaluate`'s records (kvbounds.evaluation._streams)
WRITE_FIELD = "write"     # per line: [write id, lines in that write]; a write is one trial, kept all or nothing

log = logging.getLogger("kvbounds")
_WARNED: set[str] = set()     # each distinct warning about a store once per process


def jsonable(x: Any) -> Any:
    """Convert numpy scalars/arrays and tuples to plain JSON types; non-finite floats to strings."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "tolist"):  # numpy scalar or array
        return jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)  # 'inf', 'nan': JSON has no literal for them
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    return str(x)


def canonical(obj: Any) -> str:
    return json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":"))


def trial_key(claim: str, params: dict, seed: int, backend: str) -> str:
    """Identity of a trial: a finished trial with the same key is never recomputed."""
    return hashlib.sha256(canonical([claim, params, seed, backend]).encode()).hexdigest()[:20]


DEFERRED = "deferred"    # check name of a trial not run on its backend (too large for it): no measurement


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
    source: str = ""         # paper and theorem the bound is taken from, e.g. "BalanceKV-NeurIPS Thm 3.3"
    trials: int = 1
    time_s: float = 0.0
    extra: dict = dataclasses.field(default_factory=dict)
    key: str = ""
    error: str = ""          # non-empty: the trial raised ("ExceptionType: message"); see the module doc

    def __post_init__(self):
        if self.bound_kind not in BOUND_KINDS:
            raise ValueError(f"bound_kind must be one of {BOUND_KINDS}, got {self.bound_kind!r}")
        try:
            self.measured = float(self.measured)
            self.bound = float(self.bound)
            self.time_s = float(self.time_s)
        except OverflowError:       # an integer beyond float range (a line of a damaged store)
            raise ValueError("measured, bound or time_s is an integer beyond float range") from None
        self.holds = bool(self.holds)

    @property
    def ratio(self) -> float:
        if self.bound == 0:
            return 0.0 if self.measured == 0 else math.inf
        return self.measured / self.bound

    @property
    def is_error(self) -> bool:
        return bool(self.error)

    @classmethod
    def failed(cls, claim: str, params: dict, seed: int, backend: str, error: str, traceback: str = "",
               time_s: float = 0.0) -> "Record":
        """The error record of a trial that raised (never a bound violation: see the module doc)."""
        return cls(claim, dict(params), seed, backend, math.nan, math.nan, False, check="error", time_s=time_s,
                   error=error or "error", extra={"traceback": traceback} if traceback else {})

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["ratio"] = self.ratio
        return canonical(d)

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        """Rebuild a record from its JSON form; ``ValueError`` when ``d`` is not a record."""
        if not isinstance(d, dict):
            raise ValueError(f"not a record: a JSON {type(d).__name__}")
        d = dict(d)
        d.pop("ratio", None)
        for f in ("measured", "bound", "time_s"):
            if isinstance(d.get(f), str):
                d[f] = float(d[f])        # 'inf'/'nan' as written by jsonable; anything else raises ValueError
        _check_types(d)
        _name_papers(d)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


_REQUIRED = {"claim": str, "params": dict, "seed": int, "backend": str, "measured": (int, float),
             "bound": (int, float), "holds": bool}
_OPTIONAL = {"bound_kind": str, "check": str, "control": bool, "source": str, "trials": int,
             "time_s": (int, float), "extra": dict, "key": str, "error": str}


_FLOAT_MAX = 1.7976931348623157e308


def _check_types(d: dict) -> None:
    for name, typ in _REQUIRED.items():
        if name not in d:
            raise ValueError(f"not a record: no {name!r}")
    for name, typ in {**_REQUIRED, **_OPTIONAL}.items():
        if name in d and (not isinstance(d[name], typ) or (typ in (int, (int, float)) and isinstance(d[name], bool))):
            raise ValueError(f"not a record: {name!r} is {d[name]!r:.60}")
        if typ == (int, float) and isinstance(d.get(name), int) and not -_FLOAT_MAX <= d[name] <= _FLOAT_MAX:
            raise ValueError(f"not a record: {name!r} is an integer beyond float range ({len(str(abs(d[name])))} "
                             "digits)")


# check names of records written before the papers were named (issue 25) that cite() alone does not rename
LEGACY_CHECKS = {"buckets proof001": "buckets proof", "erased share proof001": "erased share proof"}


def _name_papers(d: dict) -> None:
    """Records written before the papers were named cite them by an old three-digit label: map their check name,
    source and extra's strings to the papers' short names on read (params, and so trial keys, unchanged)."""
    if isinstance(d.get("check"), str):
        d["check"] = LEGACY_CHECKS.get(d["check"], cite(d["check"]))
    if isinstance(d.get("source"), str):
        d["source"] = cite(d["source"])
    if isinstance(d.get("extra"), dict):
        d["extra"] = {k: cite(v) if isinstance(v, str) and k != "traceback" else v for k, v in d["extra"].items()}


class StoreError(RuntimeError):
    """The output directory cannot be used (missing and not creatable, read-only, full, a file, locked).
    The message is one line meant for the user; records already written stay valid."""


class StoreLocked(StoreError):
    """Another process holds the output directory's lock (another ``kvbounds check`` is writing there)."""


class StoreOfOtherCommand(StoreError, ValueError):
    """The directory is a store another command writes (``check`` and ``evaluate`` never share one): a bad output
    directory, so a ValueError too (exit 2 on the command line, not 1 as for a store that cannot be written)."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def special_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` (a str or os.PathLike) is when it exists and is not a regular file (symlinks followed): "a
    directory", "a character device", "a block device", "a FIFO (named pipe)", "a socket", or why it cannot be
    resolved; None for a regular file or a path that does not exist (a dangling link). The store refuses such files
    before opening them; :func:`kvbounds.core._output_files.special_file` is the checked face every writer asks."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:            # a symlink loop, a component that is a file, no permission to look
        return f"a path that cannot be resolved ({e.strerror or e})"
    if stat.S_ISREG(st.st_mode):
        return None
    return next((what for test, what in _KINDS if test(st.st_mode)), "not a regular file")


def read_regular(path: Path, what: str) -> bytes | None:
    """The bytes of ``path`` (None when it does not exist), which must be a regular file: anything else (a FIFO, a
    device, a directory) is a :class:`StoreError` before it is opened, never a read that blocks; opened without
    blocking and checked again on the open descriptor."""
    special = special_kind(path)
    if special:
        raise StoreError(f"{path} ({what}) is {special}, not a regular file; move it away")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StoreError(f"cannot read {path}: {_os_error_text(e)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreError(f"{path} ({what}) is not a regular file; move it away")
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    except OSError as e:
        raise StoreError(f"cannot read {path}: {_os_error_text(e)}") from None
    finally:
        os.close(fd)


def _marked_writer(d: Path) -> str | None:
    """The writer the store marker of ``d`` names, or None (no marker, or one that names no command)."""
    data = read_regular(d / STORE_FILE, "the store marker")
    try:
        who = json.loads(data.decode("utf-8")).get("writer") if data is not None else None
    except (ValueError, AttributeError, RecursionError):
        who = None
    return who if isinstance(who, str) and who in WRITERS else None


def store_writer(out_dir: str | os.PathLike) -> str | None:
    """The command that writes the store in ``out_dir`` (a key of :data:`WRITERS`): the one its marker
    (:data:`STORE_FILE`) names, else, for a store written before markers, the one its records show (``evaluate``
    when one of them is an evaluate record, ``check`` when it holds any other); None where there is no store yet.
    Raises :class:`StoreError` for a marker or records that are not regular files."""
    d = Path(out_dir)
    who = _marked_writer(d)
    if who is not None:
        return who
    contents = ResultStore(d).read(warn=False)
    recs = contents.records + contents.errors
    if any(r.claim == EVALUATE_CLAIM for r in recs):
        return "evaluate"
    return "check" if recs else None


@dataclasses.dataclass
class StoreContents:
    """What one read of ``results.jsonl`` found."""
    records: list[Record]          # one complete run of each finished trial, in file order
    errors: list[Record]           # the last error record of each trial with no successful run
    unreadable: int = 0            # lines that are not records (bad JSON or UTF-8, not a dict, bad fields)
    first_unreadable: int = 0      # 1-based line number of the first of them
    first_reason: str = ""         # why the first of them is not a record
    partial_trials: int = 0        # writes cut short (crash, full disk): ignored, the trial is rerun
    duplicate_trials: int = 0      # further complete runs of a trial already stored: ignored

    @property
    def completed_keys(self) -> set[str]:
        return {r.key for r in self.records if r.key}


def _os_error_text(e: OSError) -> str:
    return e.strerror or errno.errorcode.get(e.errno or 0, "") or str(e)


class ResultStore:
    """Append-only JSON-lines store in ``DIR/results.jsonl``.

    One ``append`` is one write: the records of one trial, each line tagged with the write's id and
    line count (``"write": [id, n]``), written by a loop of ``os.write`` on an ``O_APPEND`` descriptor
    and fsynced. A write cut short (crash, ENOSPC) leaves fewer than ``n`` lines with its id: reading
    ignores all of them, so a trial is kept all or nothing, and ``check`` reruns it. A later complete
    run of a trial already stored (two writers before the lock existed) is ignored, so nothing counts
    twice. Lines that are not records are skipped with one warning (logger ``kvbounds``; once per process).

    Writers hold :meth:`lock` (one ``check`` per directory); readers need no lock.

    The store owns its records, its run log, its lock, its marker and the report of its records (:data:`OWNED`, and
    every file under ``figures/``): no command writes onto them but the one that keeps each (every writer asks
    :func:`kvbounds.core._output_files.store_file`, which reads this list).

    ``results.jsonl`` must be a regular file: a FIFO, a device or a directory there is refused (:class:`StoreError`)
    before it is opened, and a symbolic link is followed only to a file inside the store's own directory.

    ``writer``: the command writing (a key of :data:`WRITERS`). :meth:`lock` then records it in the store's marker
    (:data:`STORE_FILE`) and refuses a store another command writes (:class:`StoreOfOtherCommand`): ``check`` and
    ``evaluate`` never share a store.
    """

    OWNED = {RESULTS_FILE: "records", RUNS_FILE: "run log", LOCK_FILE: "lock", STORE_FILE: "store marker",
             REPORT_FILES[0]: "report", REPORT_FILES[1]: "report summary"}

    def __init__(self, out_dir: str | os.PathLike, writer: str | None = None):
        if writer is not None and writer not in WRITERS:
            raise ValueError(f"writer must be one of {tuple(WRITERS)}, got {writer!r}")
        self.dir = Path(out_dir)
        self.path = self.dir / RESULTS_FILE
        self.writer = writer

    def owned_paths(self) -> list[Path]:
        """The files of this store that exist: :data:`OWNED` and the figures."""
        figs = self.dir / FIGURES_DIR
        return ([self.dir / n for n in self.OWNED if (self.dir / n).is_file()]
                + (sorted(p for p in figs.iterdir() if p.is_file()) if figs.is_dir() else []))

    # ------------------------------------------------------------------------------------- reading
    def _check_link(self) -> None:
        """A symlinked results.jsonl is followed only to a file of this directory that is no other file of the
        store; anything else is refused (records would be read from, or appended to, a file elsewhere)."""
        if not self.path.is_symlink():
            return
        real = Path(os.path.realpath(self.path))
        inside = real.parent == Path(os.path.realpath(self.dir)) and real.name not in self.OWNED
        if not inside:
            raise StoreError(f"{self.path} is a symbolic link to {real}, outside the store's own files; records are "
                             "read and appended only inside their store: replace the link with the file")

    def read(self, warn: bool = True) -> StoreContents:
        self._check_link()
        data = read_regular(self.path, "the records")
        if data is None:
            return StoreContents([], [])
        contents = _parse(data)
        if warn:
            self._warn(contents)
        return contents

    def load(self) -> list[Record]:
        """The records of every finished trial (error records left out: see :meth:`errors`)."""
        return self.read().records

    def errors(self) -> list[Record]:
        """Error records of the trials that raised and have not succeeded since (one per trial)."""
        return self.read().errors

    def done_keys(self) -> set[str]:
        return self.read().completed_keys

    def _warn(self, c: StoreContents) -> None:
        parts = []
        if c.unreadable:
            parts.append(f"skipped {c.unreadable} line(s) that are not records (first: line {c.first_unreadable}: "
                         f"{c.first_reason})")
        if c.partial_trials:
            parts.append(f"ignored {c.partial_trials} partly written trial(s) (rerun by `kvbounds check`)")
        if c.duplicate_trials:
            parts.append(f"ignored {c.duplicate_trials} duplicate run(s) of stored trials")
        msg = f"kvbounds: warning: {self.path}: " + "; ".join(parts)
        if parts and msg not in _WARNED:
            _WARNED.add(msg)
            log.warning(msg)

    # ------------------------------------------------------------------------------------- writing
    def check_writable(self) -> None:
        """Raise :class:`StoreError` (one line) unless records can be appended; creates the directory."""
        if self.dir.exists() and not self.dir.is_dir():
            raise StoreError(f"output directory {self.dir} is a file, not a directory")
        if self.writer is not None:
            self.check_writer()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create output directory {self.dir}: {_os_error_text(e)}") from None
        try:
            os.close(self._open())
        except OSError as e:
            raise StoreError(f"cannot write to {self.path}: {_os_error_text(e)}") from None

    def check_writer(self) -> str | None:
        """:class:`StoreOfOtherCommand` when another command than :attr:`writer` writes this store; else who does."""
        who = store_writer(self.dir) if self.dir.is_dir() else None
        if who is not None and who != self.writer:
            raise StoreOfOtherCommand(
                f"{self.dir} is a {WRITERS[who]} result store; {WRITERS[self.writer]} never writes into another "
                "command's store: use another --out")
        return who

    def _mark(self) -> None:
        """Record :attr:`writer` in the store's marker (under the lock; refused when another command owns it). The
        marker is a regular file of the store (never followed through a link, never a FIFO or a device); a write
        cut short leaves a marker that names no command, which the records then decide and the next lock rewrites."""
        self.check_writer()
        if _marked_writer(self.dir) == self.writer:
            return
        path = self.dir / STORE_FILE
        if special_kind(path) or path.is_symlink():
            raise StoreError(f"{path} (the store marker) is {special_kind(path) or 'a link'}, not a regular "
                             "file; move it away")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreError(f"{path} (the store marker) is not a regular file; move it away")
            _write_all(fd, (json.dumps({"writer": self.writer}) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def lock(self):
        """A held lock on the directory (context manager); :class:`StoreLocked` if another process has it,
        :class:`StoreOfOtherCommand` when :attr:`writer` is set and another command writes the store."""
        import filelock
        self.check_writable()
        special = special_kind(self.dir / LOCK_FILE)
        if special:
            raise StoreError(f"{self.dir / LOCK_FILE} (the lock) is {special}, not a regular file; move it away")
        lock = filelock.FileLock(str(self.dir / LOCK_FILE), timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise StoreLocked(f"another `kvbounds check` is writing to {self.dir} (it holds {self.dir / LOCK_FILE}); "
                              "wait for it to finish, or use another --out") from None
        except OSError as e:
            raise StoreError(f"cannot lock {self.dir}: {_os_error_text(e)}") from None
        if self.writer is not None:
            try:
                self._mark()
            except BaseException as e:
                lock.release()
                if isinstance(e, (OSError, ValueError)) and not isinstance(e, StoreError):
                    raise StoreError(f"cannot mark {self.dir} as a {WRITERS[self.writer]} store: {e}") from None
                raise
        return _Held(lock)

    def _open(self) -> int:
        """The records opened for appending: a regular file (or a link to one inside the store), never a FIFO or a
        device (refused before the open; the open does not block, and the descriptor is checked again)."""
        self._check_link()
        special = special_kind(self.path)
        if special:
            raise StoreError(f"{self.path} (the records) is {special}, not a regular file; move it away")
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                     0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StoreError(f"{self.path} (the records) is not a regular file; move it away")
        return fd

    def append(self, records: Iterable[Record]) -> None:
        """Write ``records`` (one trial) as one all-or-nothing write; :class:`StoreError` if it fails."""
        recs = list(records)
        if not recs:
            return
        wid = uuid.uuid4().hex[:16]
        lines = []
        for r in recs:
            d = json.loads(r.to_json())
            d[WRITE_FIELD] = [wid, len(recs)]
            lines.append(canonical(d) + "\n")
        payload = "".join(lines).encode("utf-8")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = self._open()
        except OSError as e:
            raise StoreError(f"cannot write to {self.path}: {_os_error_text(e)}") from None
        try:
            size = os.fstat(fd).st_size
            if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
                payload = b"\n" + payload        # a line cut short by an earlier crash ends here
            try:
                _write_all(fd, payload)
                os.fsync(fd)
            except OSError as e:
                _undo(fd, size)
                raise StoreError(f"cannot write to {self.path}: {_os_error_text(e)} ({self._kept_text()}; "
                                 "rerun the same command to resume)") from None
        finally:
            os.close(fd)

    def _kept_text(self) -> str:
        try:
            n = len(self.read().completed_keys)
        except StoreError:
            return "the trials written before are kept"
        return f"the {n} trial(s) written before are kept"


class _Held:
    def __init__(self, lock):
        self._lock = lock

    def release(self) -> None:
        self._lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is out (a short write is not an error; a full disk is)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "write returned 0 bytes")
        view = view[n:]


def _undo(fd: int, size: int) -> None:
    """Best effort: cut a failed write back off the file (reading ignores it anyway)."""
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass


def _legacy_size(rec: Record) -> int:
    size = rec.extra.get("trial_size", 1) if rec.key else 1
    return size if isinstance(size, int) and size >= 1 else 1


def _why(e: BaseException) -> str:
    text = " ".join(str(e).split())
    text = text[:120] + "..." if len(text) > 120 else text
    return text if isinstance(e, ValueError) and text.startswith("not a record") else \
        f"{type(e).__name__}: {text}" if text else type(e).__name__


def _parse(data: bytes) -> StoreContents:
    unreadable, first_bad, first_reason = 0, 0, ""
    # (record, write id, lines in that write) for every readable line, in file order
    rows: list[tuple[Record, str | None, int]] = []
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw.decode("utf-8"))
            w = d.get(WRITE_FIELD) if isinstance(d, dict) else None
            if w is not None and not (isinstance(w, list) and len(w) == 2 and isinstance(w[0], str)
                                      and isinstance(w[1], int) and w[1] >= 1):
                raise ValueError("bad write tag")
            rows.append((Record.from_dict(d), w[0] if w else None, w[1] if w else 1))
        except (ValueError, TypeError, RecursionError, ArithmeticError) as e:   # JSONDecodeError and
            unreadable += 1                                                      # UnicodeDecodeError are ValueErrors
            if not first_bad:
                first_bad, first_reason = lineno, _why(e)

    # a write is complete when all its lines are there; lines without a tag (older files) are grouped
    # by trial key and complete when the trial's ``trial_size`` records are there
    groups: dict[tuple, list[Record]] = defaultdict(list)
    sizes: dict[tuple, int] = {}
    for rec, wid, n in rows:
        gid = ("w", wid) if wid is not None else ("k", rec.key or id(rec))
        groups[gid].append(rec)
        sizes[gid] = n if wid is not None else _legacy_size(rec)

    records: list[Record] = []
    last_error: dict[str, Record] = {}
    done: set[str] = set()
    partial = duplicates = 0
    for gid, recs in groups.items():           # dicts keep first-seen order
        if len(recs) < sizes[gid]:
            partial += 1
            continue
        if gid[0] == "k":
            recs = recs[:sizes[gid]]
        key = recs[0].key
        if any(r.is_error for r in recs):
            last_error[key or str(gid)] = recs[-1]
            continue
        if key and key in done:
            duplicates += 1
            continue
        if key:
            done.add(key)
        records.extend(recs)
    errors = [r for k, r in last_error.items() if k not in done]
    return StoreContents(records, errors, unreadable, first_bad, first_reason, partial, duplicates)
