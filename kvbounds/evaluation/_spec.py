"""What ``kvbounds evaluate SPEC`` evaluates: SPEC resolved to a compressor with the method registry's contract
(:mod:`kvbounds.methods`), and the method's name in the registry (so that ``kvbounds e2e`` and the leaderboard run
it by that name).

SPEC is one of
  * a registered method's name (``balancekv``, ``streaming_llm``, a third party's method registered through the
    entry-point group ``kvbounds.methods``): its ``compress``;
  * ``kvpress:NAME``: a press of the installed kvpress, by class name (``kvpress:KnormPress``) or by the registry's
    short name (``kvpress:knorm``), built with ``compression_ratio=R``;
  * ``module:NAME`` (``NAME`` may be dotted): an object of an importable module (the current directory first on the
    path while it imports, as for ``python -m``; ``sys.path`` restored after): a kvpress ``BasePress`` subclass (built with ``compression_ratio=R``), a press
    instance (its ratio set to R, or its inner press's for a wrapper), a :class:`kvbounds.methods.Method`, or a
    function with the method contract ``compress(K, V, floats, rng, *, sink, window, block_size=64, Q=None)``.
A press runs on streams through :mod:`kvbounds.evaluation`. A SPEC that is no registered name is registered on
the fly under SPEC itself (``source="external"``), so the rest of the package finds it by that name.

Errors (:class:`SpecError`, an InputError with one line a reader understands): a SPEC that does not import, names
nothing in its module, or names something that is neither a press nor a compressor; a press class that cannot be
built with ``compression_ratio``; a ratio outside [0, 1).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import math
import os
import sys
from typing import Callable

from kvbounds.algorithms.validation import InputError
from kvbounds.e2e import compress_kvpress_prefill

__all__ = ["SpecError", "Resolved", "resolve", "resolve_object", "check_ratio", "CONTRACT"]

CONTRACT = "compress(K, V, floats, rng, *, sink, window, block_size=64, Q=None) -> CompressedKV"


class SpecError(InputError):
    """A SPEC that cannot be evaluated (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A resolved SPEC: ``compress`` has the method contract; ``name`` is the registered method's name;
    ``kind``: "press", "compressor"; ``make_press``: for a press, ratio -> a press instance (None otherwise);
    ``decoding``: a kvpress decoding press (its base press runs on the prompt, and ``interval`` is its
    compression interval at decode time); ``needs_queries``: it reads the stream's queries."""
    spec: str
    name: str
    kind: str
    compress: Callable
    label: str
    make_press: Callable | None = None
    decoding: bool = False
    needs_queries: bool = False
    ablation: str = ""
    interval: int | None = None


def check_ratio(ratio) -> float:
    """A compression ratio in kvpress's meaning (the fraction removed): a number in [0, 1)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) \
            or not 0 <= ratio < 1:
        raise SpecError(f"--ratio must be a number in [0, 1) (kvpress's compression ratio: the fraction of the cache "
                        f"removed), got {ratio!r}")
    return float(ratio)


@contextlib.contextmanager
def _cwd_first():
    """The current directory first on ``sys.path`` while the block runs (as ``python -m`` puts it: a module in the
    current directory imports), then ``sys.path`` as it was: the caller's path is not changed for good."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _import(spec: str):
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise SpecError(f"SPEC {spec!r} is not a registered method, kvpress:NAME or module:NAME")
    try:
        with _cwd_first():
            obj = importlib.import_module(mod_name)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any import failure is the SPEC's, named (sys.exit too)
        raise SpecError(f"SPEC {spec!r} does not import: {type(e).__name__}: {' '.join(str(e).split())[:300]}") \
            from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError(f"SPEC {spec!r}: module {mod_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def _with_ratio(press, ratio: float):
    """A copy of the press instance at ``ratio``: its ``compression_ratio`` field, or, for a wrapper (AdaKV,
    ChunkKV, a decoding press), its inner press's."""
    import copy
    p = copy.deepcopy(press)
    if dataclasses.is_dataclass(p) and "compression_ratio" in {f.name for f in dataclasses.fields(p)}:
        p.compression_ratio = ratio
        return p
    for field in ("press", "base_press"):
        inner = getattr(p, field, None)
        if inner is not None:
            setattr(p, field, _with_ratio(inner, ratio))
            return p
    raise SpecError(f"{type(press).__name__} has no compression_ratio (nor an inner press with one): it cannot be "
                    "run at the battery's memory fractions")


def _press_factory(obj, label: str) -> Callable:
    from ._stream_press import is_press
    if isinstance(obj, type):
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            sig = None
        if sig is not None and "compression_ratio" not in sig.parameters \
                and not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
            wraps = [n for n in ("press", "base_press") if n in sig.parameters]
            extra = (f"; it wraps another press (its field {wraps[0]!r}): build one in a module, e.g. "
                     f"PRESS = {obj.__name__}({wraps[0]}=KnormPress()), and evaluate module:PRESS") if wraps else ""
            raise SpecError(f"{label} is a press class that takes no compression_ratio{extra}")

        def make(ratio: float):
            try:
                return obj(compression_ratio=ratio)
            except Exception as e:  # noqa: BLE001
                raise SpecError(f"{label}(compression_ratio={ratio:g}) raised {type(e).__name__}: {e}") from None
        make(0.5)                     # fails here, before any work, when the class cannot be built
        return make
    assert is_press(obj)
    from ._stream_press import is_decoding_press
    if is_decoding_press(obj):          # a decoding press: its base press compresses (the prompt, then each interval)
        obj = obj.base_press
    _with_ratio(obj, 0.5)
    return lambda ratio: _with_ratio(obj, ratio)


def _is_contract(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    names = list(params)
    kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    return len(names) >= 4 and all(p in params or kw for p in ("sink", "window"))


def _register(name: str, compress, label: str, *, press: str = "", make_press=None, source: str = "external"):
    """Register SPEC under its own name (once per process): a compressor with its ``compress``; a press also runs
    inside a model, as kvpress's presses do (``compress_prefill``, built by ``make_press`` at each ratio)."""
    from kvbounds.methods import Method, get_method, names, register
    if name in names():
        old = get_method(name)
        if old.source != source or old.label != label:
            raise SpecError(f"a different method is registered as {name!r}")
        return old
    prefill = compress_kvpress_prefill if make_press is not None else None
    return register(Method(name, compress, role="baseline", source=source, label=label, press=press,
                           needs_queries=True, compress_prefill=prefill, make_press=make_press,
                           requires="kvpress" if make_press is not None else ""))


def resolve(spec: str, ratio: float = 0.75) -> Resolved:
    """SPEC (the module docstring) as a :class:`Resolved`; ``ratio`` is checked ([0, 1)) and a press class is
    built once at it to fail early. Raises :class:`SpecError`."""
    from kvbounds import methods as registry
    from ._stream_press import press_compressor
    if not isinstance(spec, str) or not spec.strip() or spec != spec.strip():
        raise SpecError(f"SPEC must be a method name, kvpress:NAME or module:NAME, got {spec!r}")
    check_ratio(ratio)
    if spec.startswith("kvpress:"):
        return _kvpress(spec)
    if spec in registry.names() and ":" not in spec:
        m = registry.get_method(spec)
        if m.make_press is not None:      # a third party's press, registered with its press factory
            make = m.function("make_press")
            return Resolved(spec, spec, "press", press_compressor(make, name=spec), m.label or spec, make_press=make,
                            needs_queries=True)
        if m.compress is None:
            raise SpecError(f"method {spec!r} runs only inside a model's prefill (no compress on a stream): evaluate "
                            "it with --e2e")
        return Resolved(spec, spec, "compressor", m.function(), m.label or spec, needs_queries=m.needs_queries,
                        ablation=m.ablation)
    if ":" not in spec:
        import difflib
        close = difflib.get_close_matches(spec, list(registry.names()), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise SpecError(f"SPEC {spec!r} is no registered method{hint} (or give kvpress:NAME or module:NAME)")
    obj = _import(spec)
    if isinstance(obj, registry.Method):
        registry.register(obj)
        return resolve(obj.name, ratio)
    return resolve_object(obj, spec, register=True)


def resolve_object(obj, name: str = "", *, register: bool = False) -> Resolved:
    """A press (a kvpress ``BasePress`` subclass or instance) or a compressor with the method contract, as a
    :class:`Resolved` named ``name`` (default: its class or function name); ``register``: also register it under
    that name (``source="external"``). Raises :class:`SpecError` for anything else."""
    from ._stream_press import is_decoding_press, is_press, press_compressor
    if isinstance(obj, str):
        return resolve(obj)
    name = name or getattr(obj, "__name__", None) or type(obj).__name__
    if is_press(obj):
        make = _press_factory(obj, name)
        label = f"{name} (a kvpress press, run on the stream by kvbounds.evaluation._stream_press)"
        if register:
            _register(name, press_compressor(make, name=name), label, press=name, make_press=make)
        decoding = is_decoding_press(obj)
        interval = int(obj.compression_interval) if decoding and not isinstance(obj, type) else None
        return Resolved(name, name, "press", press_compressor(make, name=name), label, make_press=make,
                        decoding=decoding, needs_queries=True, interval=interval)
    if callable(obj) and not isinstance(obj, type) and _is_contract(obj):
        label = f"{name} (a compressor with the method contract)"
        if register:
            _register(name, obj, label)
        return Resolved(name, name, "compressor", obj, label, needs_queries=True)
    what = "a class" if isinstance(obj, type) else type(obj).__name__
    raise SpecError(f"{name!r} is {what}, neither a kvpress press (a BasePress subclass or instance) nor a "
                    f"compressor with the method contract {CONTRACT}")


def _kvpress(spec: str) -> Resolved:
    from kvbounds import methods as registry
    from ._stream_press import is_decoding_press, is_press, press_compressor
    name = spec.split(":", 1)[1]
    try:
        import kvpress
    except Exception as e:  # noqa: BLE001
        raise SpecError(f"SPEC {spec!r} needs kvpress ({type(e).__name__}: {e}); pip install 'kvbounds[kvpress]'") \
            from None
    short = {m.press: m.name for m in registry.methods(source="kvpress")}
    entry = spec if spec in registry.names() else short.get(name, "")
    cls_name = registry.get_method(entry).press if entry else name
    cls = getattr(kvpress, cls_name, None)
    if cls is None or not is_press(cls):
        presses = sorted(n for n in dir(kvpress) if n.endswith("Press"))
        raise SpecError(f"kvpress has no press {name!r}; its presses: {', '.join(presses)}")
    make = _press_factory(cls, spec)
    fn = press_compressor(make, name=f"kvpress.{cls_name}")
    label = f"NVIDIA kvpress's {cls_name} (run on the stream by kvbounds.evaluation._stream_press)"
    if not entry:
        _register(spec, fn, label, press=cls_name, make_press=make, source="kvpress")
    return Resolved(spec, entry or spec, "press", fn, label, make_press=make, decoding=is_decoding_press(cls),
                    needs_queries=True)
