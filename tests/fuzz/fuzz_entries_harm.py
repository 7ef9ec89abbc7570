"""Fuzz entries of issue 43 ("do no harm"): output paths of every kind (kvbounds.core._output_files: regular files, devices,
FIFOs, sockets, directories, links to them, store files, paths inside another store, the command's own input), a
record store's lines (any JSON value, integers beyond float range, wrong types, bad bytes), evaluate's arguments,
the testing API (assert_beats, assert_attention_error, kv_streams) and the report layer's files mutated as text
(summary.json and results.jsonl: bytes flipped, cut short, numbers replaced by 400-digit integers or NaN tokens).

Each call's answer is checked against what the input asks: a special file, a store's file or an input refused
(never replaced, no temporary file left), a plain file written with exactly the data; the store's valid lines
read back, each bad line counted once; an evaluate call refused naming its first bad argument, or, all arguments
good, stopped at the SPEC (nothing created); a summary that parses to the same JSON renders the same documents."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import socket
import stat
import tempfile
import zlib
from pathlib import Path

import numpy as np

from fuzz_harness import Entry, as_numpy, make_array

from kvbounds.algorithms.validation import InputError
from kvbounds.core import OutputRefused, check_output_dir, special_file, store_file, write_output
from kvbounds.core import RESULTS_FILE, STORE_FILE, Record, ResultStore, store_writer

NOT_ENTRY_POINTS = {
    # the store's exceptions (raised by the entries below: StoreError is a clear refusal of an unusable directory)
    "StoreError", "StoreLocked", "StoreOfOtherCommand", "StoreContents", "OutputRefused",
}


def _draw(values) -> int:
    return zlib.crc32(repr(as_numpy(values)).encode())


def _values(rng, cls):
    return dict(values=make_array(rng, (int(rng.integers(1, 5)),), cls))


# ------------------------------------------------------------------------------------------------ output paths

KINDS = ("new", "existing", "link to existing", "dangling link", "inside own store", "fifo", "directory", "socket",
         "device", "link to fifo", "link to directory", "link to device", "store records", "store report",
         "store figure", "link to store records", "inside other store", "inside evaluate store", "own input",
         "link to own input")
WRITTEN = ("new", "existing", "link to existing", "dangling link", "inside own store")


def _make_tree(d: Path) -> dict:
    """Every kind of target under ``d``: name -> path (a device only as root), the sockets to close."""
    own, other, ev = d / "own", d / "other", d / "ev"
    for store, who in ((own, "check"), (other, "check"), (ev, "evaluate")):
        ResultStore(store, writer=who).lock().release()
        (store / RESULTS_FILE).write_text("")
    (own / "report.html").write_text("<html>")
    (own / "figures").mkdir()
    (own / "figures" / "a.png").write_bytes(b"png")
    (d / "existing.md").write_text("old")
    (d / "input.json").write_text("{}")
    os.mkfifo(d / "fifo")
    (d / "dir").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock"))
    paths = {"new": d / "new.md", "existing": d / "existing.md", "dangling link": d / "dangling",
             "inside own store": own / "RESULTS.md", "fifo": d / "fifo", "directory": d / "dir", "socket": d / "sock",
             "store records": own / RESULTS_FILE, "store report": own / "report.html",
             "store figure": own / "figures" / "a.png", "inside other store": other / "x.md",
             "inside evaluate store": ev / "x.md", "own input": d / "input.json"}
    (d / "dangling").symlink_to(d / "target-to-be.md")
    try:
        os.mknod(d / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        paths["device"] = d / "null"
    except PermissionError:
        paths["device"] = d / "fifo"            # not root: a FIFO stands in (refused the same way)
    for kind, target in (("link to existing", "existing"), ("link to fifo", "fifo"), ("link to directory", "directory"),
                         ("link to device", "device"), ("link to store records", "store records"),
                         ("link to own input", "own input")):
        (d / kind.replace(" ", "-")).symlink_to(paths[target])
        paths[kind] = d / kind.replace(" ", "-")
    return dict(paths=paths, own=own, input=d / "input.json", sock=sock)


def _kind_of(p: Path) -> int:
    return os.lstat(p).st_mode


def _output_call(values, name, data, own):
    """write_output onto a target of a drawn kind (``name``: the new file's name; not a str: passed as the path
    itself), with the command's own store and input; then the inspectors on the same path. Returns what happened."""
    kind = KINDS[_draw(values) % len(KINDS)]
    with tempfile.TemporaryDirectory() as t:
        d = Path(t)
        tree = _make_tree(d)
        try:
            path = tree["paths"][kind] if kind != "new" or not isinstance(name, str) else \
                d / (Path(name).name or "out")
            if not isinstance(name, str) and kind == "new":
                path = name                         # a path of the wrong type: an InputError naming it
            before = {k: (_kind_of(p), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
                      for k, p in tree["paths"].items() if os.path.lexists(p)}
            try:
                write_output(path, data, stores=[tree["own"]], inputs=[tree["input"]], own=own)
                outcome = "written"
            except OutputRefused as e:
                outcome = f"refused: {e}"
            real = Path(os.path.realpath(path))
            got = real.read_bytes() if outcome == "written" and real.is_file() else None
            after = {k: (_kind_of(p), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
                     for k, p in tree["paths"].items() if os.path.lexists(p)}
            leftovers = [p.name for p in d.rglob(".*.tmp")]
            inspect = (special_file(path), store_file(path, [tree["own"]]))
            check_output_dir(tree["own"] / "figures", "*.png")
            return dict(kind=kind, outcome=outcome, got=got, before=before, after=after, leftovers=leftovers,
                        inspect=inspect)
        finally:
            tree["sock"].close()


def _check_output(out, values, name, data, own):
    kind, outcome = out["kind"], out["outcome"]
    if out["leftovers"]:
        return f"temporary files left: {out['leftovers']}"
    if kind in WRITTEN and not own:
        if outcome != "written":
            return f"{kind}: {outcome}"
        want = data.encode() if isinstance(data, str) else data if isinstance(data, bytes) else None
        if want is not None and out["got"] != want:
            return f"{kind}: wrote {out['got']!r:.60}, not the data"
        changed = [k for k in out["before"] if k not in (kind, "link to existing", "existing", "dangling link")
                   and out["before"][k] != out["after"].get(k)]
        return f"{kind}: also changed {changed}" if changed else None
    if kind not in WRITTEN and outcome == "written":
        return f"{kind}: written, not refused"
    if outcome != "written" and out["before"] != out["after"]:
        return f"{kind}: refused but something changed"
    return None


# ---------------------------------------------------------------------------------------------- store lines

BAD = ("123", "null", "[1, 2]", '"text"', "{}", "[" * 5000, '{"claim": 1', "\xff\xfe", "NaN", "1" + "0" * 400)


def _store_lines(values):
    """Six trials' records, each line kept or replaced by a bad one drawn from the values (any JSON value, a field
    of the wrong type or beyond float range, bad bytes): (bytes of the file, keys of the valid trials, bad lines)."""
    v = np.ravel(np.asarray(as_numpy(values), dtype=complex)).real if np.size(as_numpy(values)) else np.zeros(1)
    pick = _draw(values)
    lines, keys, bad = [], [], 0
    for i in range(6):
        x = float(v[i % len(v)])
        rec = Record("SB.cost", {"n": 16 * (i + 1)}, 0, "numpy", abs(x) if math.isfinite(x) else x, 1.0, True,
                     key=f"k{i}", bound_kind="shape", extra={"trial_size": 1})
        d = json.loads(rec.to_json())
        choice = (pick >> (3 * i)) % 9
        if choice < 4:                                  # kept as it is
            lines.append(json.dumps(d).encode())
            keys.append(f"k{i}")
            continue
        bad += 1
        if choice == 4:
            lines.append(BAD[(pick >> (2 * i)) % len(BAD)].encode("utf-8", "surrogateescape"))
        elif choice == 5:
            lines.append(json.dumps(dict(d, measured=int("9" * 400))).encode())
        elif choice == 6:
            lines.append(json.dumps(dict(d, holds="yes", seed=1.5)).encode())
        elif choice == 7:
            lines.append(b"\xff" + json.dumps(d).encode()[:-5])
        else:
            lines.append(json.dumps({k: val for k, val in d.items() if k != "claim"}).encode())
    return b"\n".join(lines) + b"\n", keys, bad


def _store_call(values):
    data, keys, bad = _store_lines(values)
    with tempfile.TemporaryDirectory() as t:
        d = Path(t)
        (d / RESULTS_FILE).write_bytes(data)
        st = ResultStore(d)
        c = st.read(warn=False)
        load, errors, done = st.load(), st.errors(), st.done_keys()
        who = store_writer(d)
        st.append([Record("SB.cost", {"n": 1}, 0, "numpy", 1.0, 1.0, True, key="new", bound_kind="shape")])
        again = ResultStore(d).read(warn=False)
        return dict(keys=[r.key for r in c.records], unreadable=c.unreadable, reason=c.first_reason,
                    load=[r.key for r in load], errors=errors, done=done, writer=who, want=keys, bad=bad,
                    again=[r.key for r in again.records], again_bad=again.unreadable)


def _check_store(out, values):
    if out["keys"] != out["want"] or out["load"] != out["want"] or out["done"] != set(out["want"]):
        return f"records {out['keys']} for the valid lines {out['want']}"
    if out["unreadable"] != out["bad"] or (out["bad"] and not out["reason"]):
        return f"{out['unreadable']} unreadable lines for {out['bad']} bad ones (reason {out['reason']!r})"
    if out["again"] != out["want"] + ["new"] or out["again_bad"] != out["bad"]:
        return f"after an append: {out['again']}, {out['again_bad']} unreadable"
    if out["writer"] != ("check" if out["want"] else None):
        return f"writer {out['writer']!r}"
    return None


# ------------------------------------------------------------------------------------------ evaluate's face

EVAL_OK = dict(ratio=lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               and 0 <= v < 1,
               profile=lambda v: v in ("smoke", "quick", "full") and isinstance(v, str),
               e2e=lambda v: isinstance(v, bool), decode=lambda v: isinstance(v, bool),
               workers=lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024),
               seed=lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63,
               progress=lambda v: isinstance(v, bool))
MISSING_SPEC = "kvbounds_no_such_module_zz:Press"


def _evaluate_call(ratio, profile, e2e, decode, workers, seed, progress):
    """kvbounds.evaluate with the arguments given and a SPEC that does not import: every argument is checked before
    the SPEC is, so the call must stop at the first bad argument, or at the SPEC; nothing is created."""
    import kvbounds
    with tempfile.TemporaryDirectory() as t:
        out = Path(t) / "out"
        try:
            kvbounds.evaluate(MISSING_SPEC, ratio=ratio, profile=profile, e2e=e2e, decode=decode, out=out,
                              workers=workers, seed=seed, progress=progress)
        except InputError as e:
            return str(e), out.exists()
        return "no error", out.exists()


def _check_evaluate(out, **kw):
    msg, created = out
    if created:
        return "the output directory was created"
    bad = [k for k, ok in EVAL_OK.items() if not ok(kw[k])]
    if not bad:
        return None if "does not import" in msg and MISSING_SPEC in msg else f"all arguments good, yet: {msg}"
    names = {"ratio": "--ratio"}
    return None if any(names.get(k, k) in msg for k in bad) else f"bad {bad}, message {msg!r}"


# ------------------------------------------------------------------------------------------ the testing API

def _streams(values, n=24):
    from kvbounds.testing import make_stream
    seed = _draw(values) % 1000
    return [make_stream("concentrated", n, 4, seed=seed + i) for i in range(10)]


def _beats_call(values, control, fraction, queries, alpha):
    from kvbounds.testing import assert_beats
    try:
        return "better", assert_beats("streaming_llm", control, _streams(values), fraction=fraction, queries=queries,
                                      alpha=alpha)
    except AssertionError as e:
        return "not better", str(e)


def _check_beats(out, values, control, fraction, queries, alpha):
    what, res = out
    if what == "better":
        return None if res["call"] == "better" and res["n"] == 10 else f"returned {res['call']}"
    words = ("is not better than", f"at {fraction:.0%}", "smallest detectable ratio", "families concentrated")
    missing = [w for w in words if w not in res]
    return f"message without {missing}: {res[:200]}" if missing else None


def _err_arrays(rng, cls):
    return dict(estimate=make_array(rng, (4,), cls), query=make_array(rng, (4,), cls))


def _assert_err_call(estimate, query, eps, scale, informative, upto):
    from kvbounds.testing import assert_attention_error, make_stream
    s = make_stream("clustered", 12, 4, seed=3)
    try:
        return "holds", assert_attention_error(estimate, s, query, eps, scale, upto=upto, informative=informative)
    except AssertionError as e:
        return "fails", str(e)


def _check_assert_err(out, estimate, query, eps, scale, informative, upto):
    from kvbounds.testing import make_stream
    what, res = out
    s = make_stream("clustered", 12, 4, seed=3)
    j = 12 if upto is None else upto
    q = np.asarray(query, np.float64)
    x = s.K[:j] @ q / 2.0
    w = np.exp(x - x.max())
    exact = w @ s.V[:j] / w.sum()
    err = float(np.linalg.norm(np.asarray(estimate, np.float64) - exact))
    value = {"relative": np.linalg.norm(exact), "absolute": 1.0,
             "softmax_V_F": np.linalg.norm(w / w.sum()) * np.linalg.norm(s.V[:j])}.get(scale)
    if value is None or not np.isfinite(err):
        return None
    if abs(err - eps * value) <= 1e-9 * max(err, eps * value, 1e-300):
        return None                                     # at the bound: either answer is right
    if (err <= eps * value) != (what == "holds" or "vacuous" in res):
        return f"{what} for error {err} and bound {eps * value}"
    if what == "holds" and value > 0 and not math.isclose(res, err / value, rel_tol=1e-9, abs_tol=1e-300):
        return f"constant {res} != {err / value}"
    return None


def _kv_streams_call(values, min_n, max_n, min_d, max_d):
    from hypothesis import HealthCheck, Phase, find, settings
    from kvbounds.testing.strategies import kv_streams
    strategy = kv_streams(("synthetic benign", "rope", "concentrated"), min_n=min_n, max_n=max_n, min_d=min_d,
                          max_d=max_d)
    s = find(strategy, lambda s: True, settings=settings(max_examples=1, database=None, phases=[Phase.generate],
                                                         suppress_health_check=list(HealthCheck)))
    return s.family, s.n, s.d


def _check_kv_streams(out, values, min_n, max_n, min_d, max_d):
    family, n, d = out
    if not min_n <= n <= max_n:
        return f"n = {n} outside [{min_n}, {max_n}]"
    if not min_d <= d <= max_d or (family == "rope" and d % 2):
        return f"{family}: d = {d} outside [{min_d}, {max_d}]"
    return None


# -------------------------------------------------------------------------------- report files mutated as text

def _mutated_text(text: str, values) -> tuple[bytes, object]:
    """``text`` with one textual mutation drawn from ``values``; and its JSON (or a marker when it does not parse)."""
    import re
    pick = _draw(values)
    data = text.encode()
    k = pick % 8
    pos = (pick >> 3) % max(len(data), 1)
    if k == 0:
        data = data[:pos] + bytes([data[pos] ^ (1 + (pick >> 20) % 255)]) + data[pos + 1:]
    elif k == 1:
        data = data[:pos]
    elif k in (2, 3):
        nums = [m for m in re.finditer(rb"(?<![\w.\"])-?\d+(\.\d+)?(?![\w\"])", data)]
        if nums:
            m = nums[pos % len(nums)]
            new = b"9" * 400 if k == 2 else (b"NaN", b"Infinity", b"-Infinity", b"1e999")[pick % 4]
            data = data[:m.start()] + new + data[m.end():]
    elif k == 4:
        data = b"[" * 3000 + data + b"]" * 3000
    elif k == 5:
        data = b"\xef\xbb\xbf" + data
    elif k == 6:
        data = data.replace(b"{", b'{"claim": 1, ', 1)
    else:
        data = data + b"\n" + data
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        parsed = _UNPARSED
    return data, parsed


_UNPARSED = object()


@contextlib.contextmanager
def _quiet():
    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
        yield err


def _summary_text_call(values):
    """summary.json mutated as text, through the two command lines of `make results-md` (in this process) and the
    readers: rc 0 with every document written, or rc 2 with one line and nothing written."""
    from fuzz_entries_report import base_summary
    from kvbounds.report import markdown as rm, summary_read as sr
    from kvbounds.report.markdown import FOUND_BEGIN, FOUND_END
    data, parsed = _mutated_text(base_summary(), values)
    with tempfile.TemporaryDirectory() as t:
        d = Path(t)
        (d / "summary.json").write_bytes(data)
        (d / "README.md").write_text(f"top\n{FOUND_BEGIN}\n{FOUND_END}\n")
        with _quiet() as err:
            rc_compact = sr.main([str(d / "summary.json"), str(d / "compact.json")])
            rc_md = rm.main([str(d / "summary.json"), str(d / "README.md"), str(d / "RESULTS.md")])
        docs = {n: (d / n).read_text() if (d / n).exists() else None for n in ("compact.json", "RESULTS.md",
                                                                              "README.md")}
        same = parsed is not _UNPARSED and parsed == json.loads(base_summary())
        return dict(rc=(rc_compact, rc_md), err=err.getvalue(), docs=docs, same=same)


def _check_summary_text(out, values):
    from fuzz_entries_report import _no_nan_text
    rc, err, docs = out["rc"], out["err"], out["docs"]
    if any(r not in (0, 2) for r in rc):
        return f"exit statuses {rc}"
    lines = [line for line in err.splitlines() if line.strip() and "warning" not in line]
    if rc[0] == 2 and (docs["compact.json"] is not None or len(lines) < 1):
        return "summary_read refused yet wrote, or said nothing"
    if rc[1] == 2 and docs["RESULTS.md"] is not None:
        return "report_markdown refused yet wrote RESULTS.md"
    if rc[1] == 0:
        why = _no_nan_text([docs["RESULTS.md"], docs["README.md"]])
        if why:
            return why
    if out["same"] and rc != (0, 0):
        return f"the same JSON refused: {err[:200]}"
    return None


def _records_text_call(values):
    """A results directory whose records are mutated as text: write_markdown renders it, or refuses (ReportError,
    an InputError here: no records) in one line."""
    from fuzz_entries_report import _record_lines
    from kvbounds import report as rp
    from kvbounds.report import markdown as rm
    text = "".join(json.dumps(x) + "\n" for x in _record_lines(np.ones(3)))
    data, _ = _mutated_text(text, values)
    with tempfile.TemporaryDirectory() as t:
        d = Path(t)
        (d / RESULTS_FILE).write_bytes(data)
        try:
            md = rm.write_markdown(d, d / "RESULTS.md")
        except rp.ReportError as e:
            raise InputError(f"ReportError: {e}") from None
        return md.read_text(encoding="utf-8"), ResultStore(d).read(warn=False).unreadable


def _check_records_text(out, values):
    from fuzz_entries_report import _no_nan_text
    return _no_nan_text([out[0]])


ENTRIES = [
    Entry("write_output+check_output+check_output_dir+special_file+store_file[every kind of target]", _values,
          dict(name="out.md", data="some text\n", own=False), _output_call, _check_output, torch_ok=False),
    Entry("ResultStore.read+load+errors+done_keys+append+store_writer+read_regular+Record.from_dict[bad lines]",
          _values, {}, _store_call, _check_store, torch_ok=False),
    Entry("evaluate+check_arguments[every argument]", lambda r, c: {},
          dict(ratio=0.75, profile="smoke", e2e=False, decode=False, workers=1, seed=0, progress=False),
          _evaluate_call, _check_evaluate),
    Entry("assert_beats+compare_on_streams", _values, dict(control="mean", fraction=0.25, queries=None, alpha=0.05),
          _beats_call, _check_beats, torch_ok=False),
    Entry("assert_attention_error", _err_arrays, dict(eps=1.0, scale="relative", informative=False, upto=None),
          _assert_err_call, _check_assert_err, torch_ok=False,
          nonfinite_ok=lambda out, **kw: True),
    Entry("kv_streams+families_here", _values, dict(min_n=4, max_n=16, min_d=2, max_d=6), _kv_streams_call,
          _check_kv_streams, torch_ok=False),
    Entry("summary_read.main+report_markdown.main+load_summary[summary.json mutated as text]", _values, {},
          _summary_text_call, _check_summary_text, torch_ok=False),
    Entry("write_markdown+ResultStore.read[results.jsonl mutated as text]", _values, {}, _records_text_call,
          _check_records_text, torch_ok=False),
]
