"""Writing an output file without ever losing a record: every file a command writes (the report, its summary and
figures, ``--markdown``, the README's what-we-found block, a benchmark's JSON) goes through :func:`write_output`.

* It refuses, before anything is written, a path that is a file a result store owns (records, run log, lock,
  report, figures; :func:`kvbounds.core._records.store_file` decides, symlinks resolved and hard links of the given
  stores included): :class:`OutputRefused`, naming the path and what it is. The command that keeps one of those
  files writes it with ``own=True``, which still refuses it when it is a link onto another of the store's files.
* It writes a temporary file in the target's directory and renames it over the target (``os.replace``: atomic), so
  a crash or a full disk leaves the old file or the new one, never a truncated one. A symlinked target is followed
  (the file it points to is replaced, the link kept); the file keeps its permissions (a new one gets the umask's).
"""
from __future__ import annotations

import os
from tempfile import mkstemp
from pathlib import Path
from typing import Callable, Iterable

from ._records import FIGURES_DIR, LOCK_FILE, REPORT_FILES, RESULTS_FILE, RUNS_FILE, ResultStore


class OutputRefused(ValueError):
    """An output path that is a file a result store owns: one line naming the path and what it is."""


def store_file(path: str | os.PathLike, stores: Iterable[str | os.PathLike] = ()) -> str | None:
    """What ``path`` is, when it is a file a result store owns (symlinks resolved), else None: by name, records, a
    run log or a lock anywhere, and a report or a figure in a directory that holds records; by identity (a hard
    link too), any file of the stores in ``stores``."""
    real = Path(os.path.realpath(path))
    home = real.parent.parent if real.parent.name == FIGURES_DIR else real.parent
    if real.name in (RESULTS_FILE, RUNS_FILE, LOCK_FILE) or (
            (real.name in REPORT_FILES or home != real.parent) and (home / RESULTS_FILE).is_file()):
        where = "" if real == Path(os.path.abspath(path)) else f"{real} (a link), "
        return f"{where}the {ResultStore.OWNED.get(real.name, 'report figure')} of the result store {home}"
    if os.path.exists(path):
        for d in stores:
            for p in ResultStore(d).owned_paths():
                if os.path.samefile(path, p):
                    return f"{p} (a hard link), the {ResultStore.OWNED.get(p.name, 'report figure')} of the result store {d}"
    return None


def check_output(path: str | os.PathLike, *, stores: Iterable[str | os.PathLike] = (), own: bool = False) -> None:
    """Raise :class:`OutputRefused` unless ``path`` may be written (see the module docstring). ``own``: ``path`` is
    the store's own file of that name (the report writing ``DIR/report.html``)."""
    path = Path(path)
    if own:
        home = path.parent.parent if path.parent.name == FIGURES_DIR else path.parent
        if Path(os.path.realpath(path)) != Path(os.path.realpath(path.parent)) / path.name:
            why = store_file(path, [home])
            if why:
                raise OutputRefused(f"refusing to write {path}: it is {why}")
        if path.exists():
            for p in ResultStore(home).owned_paths():
                if p.absolute() != path.absolute() and os.path.samefile(path, p):
                    raise OutputRefused(f"refusing to write {path}: it is the same file as {p} (a hard link), the "
                                        f"{ResultStore.OWNED.get(p.name, 'report figure')} of the result store {home}")
        return
    why = store_file(path, stores)
    if why:
        raise OutputRefused(f"refusing to write {path}: it is {why}; write to another file")
    if path.is_dir():
        raise OutputRefused(f"refusing to write {path}: it is a directory")


def write_output(path: str | os.PathLike, data: str | bytes | Callable[[str], None], *,
                 stores: Iterable[str | os.PathLike] = (), own: bool = False) -> Path:
    """Write ``data`` (text as UTF-8, bytes, or ``data(tmp_path)`` writing the file itself, e.g. a figure's
    ``savefig``) to ``path`` atomically, after :func:`check_output`. Returns ``path``; ``OSError`` as ``open``."""
    path = Path(path)
    check_output(path, stores=stores, own=own)
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        if callable(data):
            os.close(fd)
            fd = -1
            data(tmp)
        else:
            with os.fdopen(fd, "wb") as f:
                fd = -1
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    finally:
        if fd >= 0:
            os.close(fd)
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
