"""The fuzz harness of issue 11: input classes, a per-call time limit, and the classification of every call.

A call is classified as
  ok       a finite answer (compared with a float64 / 40-digit mpmath reference where the entry has one),
  clear    InputError, or the documented WalkFailed / DegenerateEstimate,
and otherwise as a defect:
  nan      a silent NaN/Inf in the answer,
  wrong    a finite answer that disagrees with the reference beyond its rounding bound,
  unclear  any other exception type (TypeError, AttributeError, numpy's ValueError, ...),
  hang     the call ran past the time limit: TIME_LIMIT_S seconds of the main thread's CPU time (what the call
           costs on an idle core: a loaded machine does not turn a slow call into a "hang"), or WALL_LIMIT_S of
           wall-clock time (a call blocked without computing, on a pipe say); checked by a timer signal in the main
           thread, where pytest-xdist runs tests.

Input classes: data classes (valid arrays: normal, small, norms 1e3..1e150, zeros, denormals, duplicated
rows, non-contiguous, float32, torch) crossed with one corruption of an array (NaN, Inf, empty, 0-d, wrong
ndim, mismatched shape, int/bool/complex/float16 dtype, Python list, mixed numpy/torch) or of a scalar
parameter (NaN, Inf, a string, negative, non-integer, None, huge, zero, bool).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import time
from typing import Any, Callable

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover - torch is installed by the Makefile
    torch = None

from kvbounds.algorithms.balance_kv import DegenerateEstimate
from kvbounds.algorithms.self_balancing_walk import WalkFailed
from kvbounds.algorithms.validation import InputError

CLEAR = (InputError, WalkFailed, DegenerateEstimate)
DEFECTS = ("nan", "wrong", "unclear", "hang")
TIME_LIMIT_S = 5.0         # CPU seconds of the main thread per call
WALL_LIMIT_S = 60.0        # wall-clock seconds per call (a call blocked on I/O uses no CPU)

DATA_CLASSES = ("normal", "normal", "small", "large1e3", "large1e30", "large1e150", "zeros", "denormal",
                "duplicates", "noncontig", "float32", "torch")
ARRAY_CORRUPTIONS = ("nan", "inf", "empty", "0d", "extra_dim", "missing_dim", "mismatch", "int", "bool",
                     "complex", "float16", "list", "mixed")
PARAM_VALUES = (math.nan, math.inf, -math.inf, "0.5", -1, 2.5, None, 1e200, 0, True, -0.5, 10**30)
MODES = ("valid", "valid", "array", "array", "param")


class Hang(BaseException):
    """Raised by the alarm: a BaseException, so an algorithm's ``except Exception`` cannot swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float, wall: float | None = None):
    """Raise :class:`Hang` in the block once it has used ``seconds`` of the main thread's CPU time, or ``wall``
    (default max(WALL_LIMIT_S, seconds)) seconds of wall-clock time, whichever comes first (checked by SIGALRM from
    ``seconds`` of wall clock on, every 0.5 s: no call under ``seconds`` sees a signal, as before; thread CPU time
    never runs faster than the clock). The main thread's CPU time is what the call costs on an idle core: other processes sharing the cores
    do not count, nor do a library's extra threads (which would make a process's CPU time run faster than the
    clock)."""
    if threading.current_thread() is not threading.main_thread():   # no signals off the main thread
        yield
        return
    wall = max(WALL_LIMIT_S, seconds) if wall is None else wall
    cpu0, t0 = time.thread_time(), time.monotonic()

    def on_tick(signum, frame):
        if time.thread_time() - cpu0 > seconds or time.monotonic() - t0 > wall:
            raise Hang()

    old = signal.signal(signal.SIGALRM, on_tick)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, wall), 0.5)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------------- inputs

def make_array(rng: np.random.Generator, shape: tuple[int, ...], cls: str) -> np.ndarray:
    """A valid float array of the data class ``cls`` (torch conversion happens later, per call)."""
    x = rng.standard_normal(shape)
    if cls == "small":
        x = x * 1e-3
    elif cls.startswith("large"):
        x = x * float(cls[5:])
    elif cls == "zeros":
        x = np.zeros(shape)
    elif cls == "denormal":
        x = x * 1e-310
    elif cls == "duplicates" and len(shape) >= 2 and shape[-2] > 1:
        x = np.take(x, rng.integers(0, 2, shape[-2]), axis=-2)
    elif cls == "noncontig" and len(shape) >= 1:
        x = np.repeat(x, 2, axis=-1)[..., ::2]
        if len(shape) >= 2:
            x = np.asfortranarray(x)
    elif cls == "float32":
        x = x.astype(np.float32)
    return x


def corrupt(x: Any, kind: str, rng: np.random.Generator) -> Any:
    x = np.asarray(x)
    if kind in ("nan", "inf"):
        y = np.array(x, dtype=np.float64 if x.dtype.kind != "f" else x.dtype)
        if y.size:
            y.flat[int(rng.integers(y.size))] = np.nan if kind == "nan" else (np.inf if rng.random() < .5 else -np.inf)
        return y
    if kind == "empty":
        return x[..., :0, :] if x.ndim >= 2 else x[:0] if x.ndim == 1 else np.zeros(0)
    if kind == "0d":
        return np.asarray(1.5)
    if kind == "extra_dim":
        return x[None]
    if kind == "missing_dim":
        return x[0] if x.ndim and x.shape[0] else np.asarray(1.0)
    if kind == "mismatch":
        if x.ndim == 0:
            return np.ones(2)
        return np.concatenate([x, np.ones(x.shape[:-1] + (1,), dtype=x.dtype)], axis=-1)
    if kind == "int":
        return (x * 3).astype(np.int64) if x.dtype.kind in "fc" else x.astype(np.int64)
    if kind == "bool":
        return x > 0
    if kind == "complex":
        return x.astype(np.complex128) + 1j
    if kind == "float16":
        return x.astype(np.float16)
    if kind == "list":
        return x.tolist()
    if kind == "mixed":
        return torch.as_tensor(x) if torch is not None else x.tolist()
    raise AssertionError(kind)


def to_torch(x: Any) -> Any:
    if torch is not None and isinstance(x, np.ndarray) and x.dtype.kind in "fiub":
        return torch.as_tensor(np.ascontiguousarray(x))
    return x


def as_numpy(x: Any) -> Any:
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return x


# ------------------------------------------------------------------------------------------- entries

@dataclasses.dataclass
class Entry:
    """One public entry point: ``arrays(rng, cls)`` valid arrays, ``params`` valid scalars (the value
    ``RNG`` becomes a fresh numpy Generator), ``call(**kw)`` the call, ``check(out, **kw)`` -> None or why
    the answer is wrong, ``nonfinite_ok(out, **kw)`` for documented non-finite outputs."""
    name: str
    arrays: Callable[[np.random.Generator, str], dict]
    params: dict
    call: Callable[..., Any]
    check: Callable[..., str | None] | None = None
    nonfinite_ok: Callable[..., bool] | None = None
    torch_ok: bool = True       # arrays of the torch data class are a valid input
    owner: str | None = None    # another engineer's module: defects reported there, the test is xfail (issue 24)


RNG = object()


@dataclasses.dataclass
class Case:
    data: str
    mode: str
    target: str | None
    corruption: Any
    seed: int

    def describe(self) -> str:
        what = "" if self.mode == "valid" else f", {self.target} <- {self.corruption!r}"
        return f"data={self.data}, seed={self.seed}{what}"


def build(entry: Entry, case: Case) -> dict:
    rng = np.random.default_rng(case.seed)
    arrays = entry.arrays(rng, case.data if case.data != "torch" else "normal")
    kw = dict(arrays)
    for k, v in entry.params.items():
        kw[k] = np.random.default_rng(case.seed + 1) if v is RNG else v
    if case.data == "torch" and entry.torch_ok:
        kw = {k: to_torch(v) if k in arrays else v for k, v in kw.items()}
    if case.mode == "array" and case.target in arrays:
        kw[case.target] = corrupt(as_numpy(kw[case.target]), case.corruption, rng)
    elif case.mode == "param" and case.target in entry.params:
        kw[case.target] = case.corruption
    return kw


def nonfinite(out: Any) -> bool:
    if out is None or isinstance(out, (str, bool, np.bool_)):
        return False
    if isinstance(out, (int, np.integer)):
        return False
    if isinstance(out, (float, np.floating)):
        return not math.isfinite(out)
    if isinstance(out, dict):
        return any(nonfinite(v) for v in out.values())
    if isinstance(out, (list, tuple)):
        return any(nonfinite(v) for v in out)
    if dataclasses.is_dataclass(out):
        return any(nonfinite(getattr(out, f.name)) for f in dataclasses.fields(out))
    a = as_numpy(out)
    if isinstance(a, np.ndarray):
        if a.dtype.kind == "f" or a.dtype.kind == "c":
            return not bool(np.all(np.isfinite(a)))
        return False
    return False


def classify(entry: Entry, kw: dict) -> tuple[str, str]:
    """(outcome, detail) of one call."""
    try:
        with time_limit(TIME_LIMIT_S):
            out = entry.call(**kw)
    except Hang:
        return "hang", f"no answer within {TIME_LIMIT_S} CPU seconds (or {WALL_LIMIT_S} s of wall clock)"
    except CLEAR as e:
        return "clear", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - the classification is the point
        return "unclear", f"{type(e).__name__}: {e}"
    if nonfinite(out) and not (entry.nonfinite_ok and entry.nonfinite_ok(out, **kw)):
        return "nan", "non-finite entries in the answer"
    if entry.check is not None:
        try:
            why = entry.check(out, **{k: as_numpy(v) for k, v in kw.items()})
        except Exception as e:  # noqa: BLE001 - a reference that cannot run is the harness's problem
            return "harness", f"reference of {entry.name} failed: {type(e).__name__}: {e}"
        if why:
            return "wrong", why
    return "ok", ""


# ------------------------------------------------------------------------------------------- references

def mp_softmax_attention(q: np.ndarray, K: np.ndarray, V: np.ndarray, scale: float, extra=None):
    """softmax(scale K q + extra)^T V with 40 significant digits, and the rounding tolerance of a float
    implementation: logits computed in floating point are off by at most delta (absolute), which moves each
    weight by a factor in [e^{-2 delta}, e^{2 delta}]. Returns (out (s,), tol (s,))."""
    import mpmath as mp
    mp.mp.dps = 40
    q = np.asarray(q, np.float64)
    K = np.asarray(K, np.float64)
    V = np.asarray(V, np.float64)
    n, d = K.shape
    ex = np.zeros(n) if extra is None else np.asarray(extra, np.float64)
    logits = [mp.mpf(scale) * mp.fsum(mp.mpf(float(a)) * mp.mpf(float(b)) for a, b in zip(q, K[i])) + mp.mpf(float(ex[i]))
              for i in range(n)]
    mx = max(logits)
    w = [mp.exp(li - mx) for li in logits]
    Z = mp.fsum(w)
    w = [wi / Z for wi in w]
    out = np.array([float(mp.fsum(w[i] * mp.mpf(float(V[i, j])) for i in range(n))) for j in range(V.shape[1])])
    return out, w


def attention_tolerance(w, q, K, V, scale: float, eps: float, extra=None) -> float:
    import mpmath as mp
    d = K.shape[1]
    qn = float(np.linalg.norm(np.asarray(q, np.float64)))
    kn = float(np.max(np.linalg.norm(np.asarray(K, np.float64), axis=1)))
    ex = 0.0 if extra is None else float(np.max(np.abs(extra)))
    delta = 2 * (d + 4) * eps * (scale * qn * kn + ex) + 16 * eps
    grow = mp.expm1(mp.mpf(2 * delta))
    moved = mp.fsum(min(wi * grow, mp.mpf(1)) for wi in w)
    vmax = float(np.max(np.abs(V))) if V.size else 0.0
    return float(2 * moved) * vmax + 64 * eps * vmax + 1e-300


def eps_of(*xs) -> float:
    return max(float(np.finfo(np.asarray(x).dtype).eps) if np.asarray(x).dtype.kind == "f" else 2.2e-16 for x in xs)


def compare_attention(out, q, K, V, scale, extra=None) -> str | None:
    """None if every row of ``out`` (s,) / (m, s) matches the mpmath softmax within its rounding bound."""
    out = np.asarray(as_numpy(out), np.float64)
    q2 = np.atleast_2d(q)
    if q2.shape[0] == 0:
        return None if out.size == 0 else f"answer {out} for zero queries"
    o2 = out.reshape(q2.shape[0], -1)
    eps = eps_of(q, K, V)
    for i in range(q2.shape[0]):
        ref, w = mp_softmax_attention(q2[i], K, V, scale, extra)
        tol = attention_tolerance(w, q2[i], K, V, scale, eps, extra)
        err = float(np.max(np.abs(o2[i] - ref))) if ref.size else 0.0
        if not err <= tol:
            return f"row {i}: |out - mpmath| = {err:.3g} > tolerance {tol:.3g} (out {o2[i]}, ref {ref})"
    return None


def run_tally(entries: list[Entry], cases_per_entry: int, seed: int = 0, progress=None) -> dict:
    """Without hypothesis: draw cases with numpy and count outcomes (the before/after table of the report)."""
    rng = np.random.default_rng(seed)
    tally: dict[str, dict[str, int]] = {}
    examples: dict[str, list[str]] = {}
    for e in entries:
        if progress:
            progress(e.name)
        t = tally.setdefault(e.name, {k: 0 for k in ("ok", "clear", "harness") + DEFECTS})
        for _ in range(cases_per_entry):
            case = random_case(e, rng)
            outcome, detail = classify(e, build(e, case))
            t[outcome] += 1
            if outcome in DEFECTS + ("harness",) and len(examples.setdefault(e.name, [])) < 3:
                examples[e.name].append(f"{outcome}: {case.describe()}: {detail[:200]}")
    return dict(tally=tally, examples=examples)


def random_case(entry: Entry, rng: np.random.Generator) -> Case:
    mode = MODES[int(rng.integers(len(MODES)))]
    data = DATA_CLASSES[int(rng.integers(len(DATA_CLASSES)))]
    names = list(entry.arrays(np.random.default_rng(0), "normal")) if mode == "array" else list(entry.params)
    if mode != "valid" and not names:
        mode = "valid"
    target = corruption = None
    if mode == "array":
        target, corruption = names[int(rng.integers(len(names)))], ARRAY_CORRUPTIONS[int(rng.integers(len(ARRAY_CORRUPTIONS)))]
    elif mode == "param":
        target, corruption = names[int(rng.integers(len(names)))], PARAM_VALUES[int(rng.integers(len(PARAM_VALUES)))]
    return Case(data, mode, target, corruption, int(rng.integers(2**31)))
