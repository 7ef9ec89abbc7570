"""docs/TESTING.md is kept true: its example suite (a toy press with a planted bug and its tests) is copied out of the
document's ``# file:`` blocks and run with pytest in a fresh interpreter, the plugin loaded from its entry point. It
must fail the sink property with the shrunk counterexample the document shows, pass the rest (the slow check skipped
on the smoke profile), and pass entirely once the sink is reserved, as the document says."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "TESTING.md"


def blocks() -> dict[str, str]:
    out = {}
    for code in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        first, _, rest = code.partition("\n")
        m = re.fullmatch(r"# file: (\S+)", first.strip())
        if m:
            out[m.group(1)] = rest
    return out


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd)] + sys.path), PYTHONDONTWRITEBYTECODE="1")
    env.pop("KVBOUNDS_PROFILE", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--hypothesis-seed", "0", "--rootdir", str(cwd), "test_toy_press.py", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


def test_the_example_suite_finds_the_planted_bug_with_a_shrunk_counterexample(tmp_path):
    files = blocks()
    assert set(files) == {"toy_press.py", "test_toy_press.py"}
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    res = _pytest(tmp_path)
    out = res.stdout
    assert res.returncode == 1, out[-3000:] + res.stderr[-2000:]
    assert "1 failed, 8 passed, 1 skipped" in out, out[-2000:]
    shown = re.search(r"```text\n(.*?)```", DOC.read_text(), re.S).group(1)
    assert "stream=make_stream('synthetic benign', n=8, d=2, seed=0)" in shown
    for line in shown.splitlines()[:4]:                     # the error and the shrunk stream, as the document shows
        assert line.strip() in out, (line, out[-3000:])

    fixed = files["toy_press.py"].replace("    idx = np.sort(", "    scores[:, :sink] = np.inf\n    idx = np.sort(")
    assert fixed != files["toy_press.py"]
    (tmp_path / "toy_press.py").write_text(fixed)
    res = _pytest(tmp_path)
    assert res.returncode == 0 and "9 passed, 1 skipped" in res.stdout, res.stdout[-3000:]
