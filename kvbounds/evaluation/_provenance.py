"""Which code produced an evaluation: the method's source, the stream set's and the protocol's source, and the
versions of kvbounds, kvpress, transformers and torch, hashed into every evaluate trial's key.

A record of ``kvbounds evaluate`` is keyed on its params (:class:`kvbounds.run.Trial`), and the params carry
``code`` = :func:`fingerprint`'s short hash: a changed method (its module's file, or its own source when it has no
file), a changed stream generator or evaluation protocol, or another version of one of the four packages gives
new keys, so the trials run again instead of the old method's verdict coming back. ``--force`` (``force=True``)
adds ``rerun`` = a fresh token to the params: every trial runs again even with nothing changed. evaluation.json
and the card carry the whole fingerprint (:func:`fingerprint`'s dict).

Nothing here imports kvpress, transformers or torch: versions are read from the installed distributions'
metadata, sources from the files of modules already imported (resolving the SPEC imported them).
"""
from __future__ import annotations

import hashlib
import inspect
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["PACKAGES", "fingerprint", "versions", "source_hash", "rerun_token"]

PACKAGES = ("kvbounds", "kvpress", "transformers", "torch")
# the stream set and the protocol: the stream families' generators, the evaluation's trial code and the battery's
# controls (the families' names and sizes are in each trial's params; the card's code reruns nothing)
_STREAM_FILES = ("streams/_families.py", "streams/_power.py", "evaluation/_streams.py", "evaluation/_stream_press.py",
                 "battery/_controls.py")


def versions() -> dict[str, str]:
    """{package: installed version, or "not installed"} for :data:`PACKAGES` (read from metadata, not imported)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def _digest(chunks) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c if isinstance(c, bytes) else str(c).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _object_source(obj) -> tuple[str, bytes]:
    """(where, bytes) of the code defining ``obj``: its module's file contents when the module has a file, else
    the object's own source, else its qualified name (a builtin: its package's version stands for it)."""
    obj = getattr(obj, "func", obj)                      # a functools.partial: the function it calls
    target = obj if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj) else type(obj)
    mod = target if inspect.ismodule(target) else sys.modules.get(getattr(target, "__module__", "") or "")
    path = getattr(mod, "__file__", None)
    if path and Path(path).is_file():
        return f"{mod.__name__} (its file)", Path(path).read_bytes()
    try:
        return f"source of {getattr(target, '__qualname__', target)!r}", inspect.getsource(target).encode()
    except (OSError, TypeError):
        return f"name {getattr(target, '__qualname__', repr(target))!r}", \
            f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}".encode()


def source_hash(*objects) -> tuple[str, list[str]]:
    """(short sha-256 of the code of ``objects``, where each came from): :func:`_object_source` per object."""
    parts = dict(_object_source(o) for o in objects if o is not None)      # one entry per file or source
    return _digest(b for _, b in parts.items()), list(parts)


def _method_objects(resolved) -> list:
    """The objects whose code is the method: the SPEC's module (``module:NAME``), the press's class (a press:
    built once at ratio 0.5, its type; a wrapper's inner press too), the compressor function."""
    objs = []
    spec = resolved.spec
    if ":" in spec and not spec.startswith("kvpress:"):
        mod = sys.modules.get(spec.split(":", 1)[0])
        if mod is not None:
            objs.append(mod)
    if resolved.make_press is not None:
        press = resolved.make_press(0.5)
        objs.append(type(press))
        for field in ("press", "base_press"):
            inner = getattr(press, field, None)
            if inner is not None:
                objs.append(type(inner))
    else:
        objs.append(resolved.compress)
    return objs


def fingerprint(resolved) -> dict:
    """The code and versions an evaluation of ``resolved`` (:class:`kvbounds.evaluation._spec.Resolved`) runs:
    ``{"key": short hash of all below, "method": hash of the method's code, "method_files": where it came from,
    "streams": hash of the stream set's and protocol's code, "versions": versions()}``."""
    method, where = source_hash(*_method_objects(resolved))
    root = Path(__file__).resolve().parents[1]
    streams = _digest((root / f).read_bytes() for f in _STREAM_FILES if (root / f).is_file())
    vs = versions()
    key = _digest([method, streams] + [f"{k}={v}" for k, v in sorted(vs.items())])
    return dict(key=key, method=method, method_files=where, streams=streams, versions=vs)


def rerun_token() -> str:
    """A token no earlier run used (``--force``): the time in nanoseconds."""
    return str(time.time_ns())
