"""Writing an output file without harm and without ever losing a record: every file a command writes (the report, its
summary and figures, ``--markdown``, the README's what-we-found block, a benchmark's JSON) goes through
:func:`write_output`.

* It refuses, before anything is written (:class:`OutputRefused`, one line naming the path and what it is), any path
  that is not a regular file the command may replace, symlinks resolved first and the target judged:
    - a directory, a device (``/dev/null`` too), a FIFO or a socket: a command writes regular files only;
    - a file a result store owns (records, run log, lock, store marker, report, figures; :func:`store_file` decides,
      hard links of the given stores included);
    - any path inside another result store (a directory holding ``results.jsonl`` written by ``kvbounds check`` or
      ``kvbounds evaluate``) than the command's own (``stores``, and the file's own store with ``own=True``);
    - one of the command's own inputs (``inputs``: ``python -m kvbounds.report.markdown SRC README RESULTS`` with
      RESULTS = SRC would replace its source).
  The command that keeps one of the store's files writes it with ``own=True``, which still refuses it when it is a
  link onto another of the store's files.
* It writes a temporary file in the target's directory and renames it over the target (``os.replace``: atomic), so
  a crash or a full disk leaves the old file or the new one, never a truncated one. A symlinked target is followed
  (the file it points to is replaced, the link kept); the file keeps its permissions (a new one gets the umask's).
  The target is judged again just before the rename, so a special file put there meanwhile is not replaced either.
"""
from __future__ import annotations

import os
from tempfile import mkstemp
from pathlib import Path
from typing import Callable, Iterable

from kvbounds.algorithms.validation import InputError
from ._records import (FIGURES_DIR, LOCK_FILE, REPORT_FILES, RESULTS_FILE, RUNS_FILE, STORE_FILE, ResultStore,
                       special_kind)


class OutputRefused(InputError):
    """An output path the command may not write: one line naming the path and what it is."""


def _as_path(path, name: str = "path") -> Path:
    """``path`` (a str or os.PathLike naming a file) as a Path; anything else an InputError naming ``name``."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes) or not os.fspath(path) \
            or "\0" in os.fspath(path):
        raise InputError(f"{name} must be a file path (a non-empty str or os.PathLike), got {path!r:.80}")
    return Path(path)


def _as_paths(paths, name: str) -> list[Path]:
    if isinstance(paths, (str, bytes, os.PathLike)) or not hasattr(paths, "__iter__"):
        raise InputError(f"{name} must be a sequence of paths, got {paths!r:.80}")
    return [_as_path(p, name) for p in paths]


def special_file(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists and is not a regular file (symlinks followed): "a directory", "a character
    device", "a block device", "a FIFO (named pipe)", "a socket", or why it cannot be resolved; None for a regular
    file or a path that does not exist (a dangling link: its target would be created). The argument checked
    (InputError), then :func:`kvbounds.core._records.special_kind`."""
    return special_kind(_as_path(path))


def _home(real: Path) -> Path:
    """The directory whose store a file belongs to: its own, or the store's for a file under ``figures/``."""
    return real.parent.parent if real.parent.name == FIGURES_DIR else real.parent


def _is_store(d: Path) -> bool:
    return os.path.lexists(d / RESULTS_FILE) or os.path.lexists(d / STORE_FILE)


def _same_dir(a: Path, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(os.path.realpath(a)) == Path(os.path.realpath(b))


def store_file(path: str | os.PathLike, stores: Iterable[str | os.PathLike] = ()) -> str | None:
    """What ``path`` is, when it is a file a result store owns (symlinks resolved), else None: by name, records, a
    run log, a lock or a store marker anywhere, and a report or a figure in a directory that holds records; by
    identity (a hard link too), any file of the stores in ``stores``."""
    path, stores = _as_path(path), _as_paths(stores, "stores")
    real = Path(os.path.realpath(path))
    home = _home(real)
    if real.name in (RESULTS_FILE, RUNS_FILE, LOCK_FILE, STORE_FILE) or (
            (real.name in REPORT_FILES or home != real.parent) and (home / RESULTS_FILE).is_file()):
        where = "" if real == Path(os.path.abspath(path)) else f"{real} (a link), "
        return f"{where}the {ResultStore.OWNED.get(real.name, 'report figure')} of the result store {home}"
    if os.path.exists(path):
        for d in stores:
            for p in ResultStore(d).owned_paths():
                if os.path.samefile(path, p):
                    return f"{p} (a hard link), the {ResultStore.OWNED.get(p.name, 'report figure')} of the result store {d}"
    return None


def _refuse_kind(path: Path) -> None:
    """A directory, a device, a FIFO or a socket (symlinks resolved): refused."""
    what = special_file(path)
    if what:
        real = Path(os.path.realpath(path))
        link = "" if real == Path(os.path.abspath(path)) else f"{real} (a link), "
        raise OutputRefused(f"refusing to write {path}: it is {link}{what}; a command writes regular files only")


def _refuse_inputs(path: Path, inputs: Iterable[str | os.PathLike]) -> None:
    for src in inputs:
        same = (os.path.exists(path) and os.path.exists(src) and os.path.samefile(path, src)) \
            or Path(os.path.realpath(path)) == Path(os.path.realpath(src))
        if same:
            raise OutputRefused(f"refusing to write {path}: it is the command's own input {src}; write to another file")


def _refuse_other_store(path: Path, own: Iterable[str | os.PathLike]) -> None:
    """A path inside a result store (a ``check`` or ``evaluate`` directory) that is not one of ``own``: refused."""
    real = Path(os.path.realpath(path))
    for home in dict.fromkeys((real.parent, _home(real))):
        if _is_store(home) and not any(_same_dir(home, d) for d in own):
            from ._records import store_writer
            who = store_writer(home)
            what = f"the `kvbounds {who}` result store {home}" if who else f"the result store {home}"
            raise OutputRefused(f"refusing to write {path}: it is inside {what}, which this command does not own; "
                                "write outside it")


def check_output(path: str | os.PathLike, *, stores: Iterable[str | os.PathLike] = (), own: bool = False,
                 inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Raise :class:`OutputRefused` unless ``path`` may be written (see the module docstring). ``stores``: the
    command's own result stores (their files refused by identity, a path inside them allowed); ``own``: ``path`` is
    the store's own file of that name (the report writing ``DIR/report.html``); ``inputs``: the files the command
    reads."""
    path, stores, inputs = _as_path(path), _as_paths(stores, "stores"), _as_paths(inputs, "inputs")
    if not isinstance(own, bool):
        raise InputError(f"own must be True or False, got {own!r:.80}")
    _refuse_kind(path)
    _refuse_inputs(path, inputs)
    if own:
        home = _home(path)
        if Path(os.path.realpath(path)) != Path(os.path.realpath(path.parent)) / path.name:
            why = store_file(path, [home])
            if why:
                raise OutputRefused(f"refusing to write {path}: it is {why}")
        if path.exists():
            for p in ResultStore(home).owned_paths():
                if p.absolute() != path.absolute() and os.path.samefile(path, p):
                    raise OutputRefused(f"refusing to write {path}: it is the same file as {p} (a hard link), the "
                                        f"{ResultStore.OWNED.get(p.name, 'report figure')} of the result store {home}")
        _refuse_other_store(path, stores + [home])
        return
    why = store_file(path, stores)
    if why:
        raise OutputRefused(f"refusing to write {path}: it is {why}; write to another file")
    _refuse_other_store(path, stores)


def check_output_dir(d: str | os.PathLike, pattern: str = "*") -> None:
    """Raise :class:`OutputRefused` unless ``d`` may hold a command's own files and its files matching ``pattern``
    may be replaced or removed (the report's ``figures/``): ``d`` missing, or a directory that is not a link (a
    link's target would lose its files), whose entries matching ``pattern`` are regular files."""
    d = _as_path(d, "d")
    if not isinstance(pattern, str) or not pattern:
        raise InputError(f"pattern must be a non-empty glob pattern, got {pattern!r:.80}")
    if d.is_symlink():
        raise OutputRefused(f"refusing to write into {d}: it is a link to {os.path.realpath(d)}; the command writes "
                            "and removes its files only in a directory of its own")
    if not os.path.lexists(d):
        return
    if not d.is_dir():
        raise OutputRefused(f"refusing to write into {d}: it is {special_file(d) or 'a file'}, not a directory")
    for p in sorted(d.glob(pattern)):
        what = special_file(p)
        if what:
            raise OutputRefused(f"refusing to write {p}: it is {what}; a command writes regular files only")


def write_output(path: str | os.PathLike, data: str | bytes | Callable[[str], None], *,
                 stores: Iterable[str | os.PathLike] = (), own: bool = False,
                 inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Write ``data`` (text as UTF-8, bytes, or ``data(tmp_path)`` writing the file itself, e.g. a figure's
    ``savefig``) to ``path`` atomically, after :func:`check_output`. Returns ``path``; ``OSError`` as ``open``."""
    path, stores, inputs = _as_path(path), _as_paths(stores, "stores"), _as_paths(inputs, "inputs")
    if not isinstance(data, (str, bytes)) and not callable(data):
        raise InputError(f"data must be text, bytes or a function writing the file, got {type(data).__name__}")
    check_output(path, stores=stores, own=own, inputs=inputs)
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
        _refuse_kind(target)             # again, just before the rename: nothing special put there meanwhile
        os.replace(tmp, target)
    finally:
        if fd >= 0:
            os.close(fd)
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
