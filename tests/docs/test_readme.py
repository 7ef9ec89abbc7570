"""The README's Python examples run as written and print what the README shows.

Each ```python block runs in a fresh interpreter (its numerical pools on one thread each: `make test` runs two
xdist workers on two cores, where a second OpenMP/BLAS thread only spins against them); when a ```text block
follows it directly, that is the output it must print: the same words, integers equal, decimals within 25% (or
0.02), so a faster implementation that draws the same numbers in another order does not break the README. It runs
with only the distributions its install lines bring (tests/readme_installs.py: the ``pip install`` lines of its
section, read against pyproject.toml's extras), so an example needing a package its line does not install fails.

Portable: the examples print only digits no CPU kernel changes. Measured under seven settings (AVX-512 at 2 and 1
threads, ATEN_CPU_CAPABILITY=default and avx2, OPENBLAS_CORETYPE=Prescott and Haswell, MKL_CBWR=COMPATIBLE with
no SIMD) every example printed the same text; the unrounded numbers moved by <= 1e-9 while the nearest one to a
rounding boundary (the Frequent Directions error 74.3516, printed 74.4) is 1.5e-3 from it."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import readme_installs

pytestmark = pytest.mark.float_sensitive     # printed digits (make test-portable reruns them on other kernels)

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```(?:\s*```text\n(.*?)```)?", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def examples() -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer((ROOT / "README.md").read_text())]


def same_output(got: str, want: str) -> bool:
    g, w = got.strip().splitlines(), want.strip().splitlines()
    if len(g) != len(w):
        return False
    for a, b in zip(g, w):
        if NUMBER.sub("#", a).split() != NUMBER.sub("#", b).split():
            return False
        for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
            if "." not in y and "e" not in y:
                if x != y:
                    return False
            elif abs(float(x) - float(y)) > max(0.25 * abs(float(y)), 0.02):
                return False
    return True


def test_readme_has_an_example_per_family():
    code = "\n".join(c for c, _ in examples())
    for name in ("BalanceKV", "SubGen", "FrequentDirections", "SubspaceAttention", "make_selector"):
        assert name in code, name
    assert all(out for _, out in examples()), "every example shows its output"


@pytest.fixture(scope="module")
def install_sites(tmp_path_factory):
    return readme_installs.Sites(tmp_path_factory.mktemp("readme-sites"))


@pytest.mark.parametrize("i", range(len(examples())))
def test_readme_example_runs(i, tmp_path, install_sites):
    code, want = examples()[i]
    site = install_sites.for_commands(readme_installs.examples()[i][2])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    res = subprocess.run(readme_installs.python_argv(site, code), capture_output=True, text=True, cwd=tmp_path,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    if want is not None:
        assert same_output(res.stdout, want), f"printed:\n{res.stdout}\nREADME shows:\n{want}"


def test_same_output_tolerance():
    assert same_output("kept 268 of 1024; error 0.18", "kept 268 of 1024; error 0.2")
    assert not same_output("kept 267 of 1024; error 0.18", "kept 268 of 1024; error 0.18")
    assert not same_output("error 0.5", "error 0.18")
