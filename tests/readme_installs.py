"""The README's install lines and what they bring, for the tests that hold the README to them.

Every ```python example of the README has install lines: the ``pip install ...`` commands (inline code or a
```bash block) between the nearest heading above it and the example. What a line brings is read from
pyproject.toml (kvbounds' own dependencies and extras) and from the installed packages' metadata (their
dependencies, markers evaluated here, recursively). :class:`Sites` builds a site-packages folder holding only
those distributions (links into this environment's), so an example run there (``python -S``, the folder added by
``site.addsitedir``) fails on a package its install line does not bring, as it would in a fresh environment, at
the cost of a few hundred links instead of an install.
"""
from __future__ import annotations

import importlib.metadata as md
import re
import shlex
import sys
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLE = re.compile(r"```python\n(.*?)```(?:\s*```text\n(.*?)```)?", re.S)   # as tests/docs/test_readme.py reads them
FENCE = re.compile(r"```.*?```", re.S)
HEADING = re.compile(r"^#{1,6} .*$", re.M)
PIP_INSTALL = re.compile(r"pip install ([^`\n#]+)")
# what `python -m venv` puts in every environment besides the standard library
VENV_DEFAULT = frozenset({"pip"})
WHEEL = re.compile(r"^(?:.*/)?kvbounds-[^/\[]+\.whl(\[[\w,]+\])?$")
OPTIONS_WITH_VALUE = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c", "--constraint"}


def examples(text: str | None = None) -> list[tuple[str, str | None, list[str]]]:
    """(code, output shown or None, install commands) of each ```python block, in order."""
    text = README.read_text() if text is None else text
    fences = [m.span() for m in FENCE.finditer(text)]
    headings = [m.start() for m in HEADING.finditer(text)
                if not any(a <= m.start() < b for a, b in fences)]
    out = []
    for m in EXAMPLE.finditer(text):
        top = max((h for h in headings if h < m.start()), default=0)
        out.append((m.group(1), m.group(2), [c.strip() for c in PIP_INSTALL.findall(text[top:m.start()])]))
    return out


def parse_command(command: str) -> tuple[list[str], bool]:
    """(requirement strings, --no-deps) of one ``pip install`` command's arguments; ``.`` and ``'.[a,b]'`` are
    ``kvbounds`` and ``kvbounds[a,b]``."""
    args, reqs, no_deps, skip = shlex.split(command), [], False, False
    for a in args:
        if skip:
            skip = False
        elif a in OPTIONS_WITH_VALUE:
            skip = True
        elif a == "--no-deps":
            no_deps = True
        elif a.startswith("-"):
            continue
        elif a == "." or a.startswith(".["):
            reqs.append("kvbounds" + a[1:])
        elif WHEEL.match(a):                    # a built wheel of kvbounds, with its extras
            reqs.append("kvbounds" + (WHEEL.match(a).group(1) or ""))
        else:
            reqs.append(a)
    return reqs, no_deps


def own_requirements(extras: set[str]) -> list[Requirement]:
    """kvbounds' dependencies, and those of the extras named, as pyproject.toml declares them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    unknown = extras - set(project["optional-dependencies"])
    if unknown:
        raise KeyError(f"no extra {sorted(unknown)} in pyproject.toml")
    reqs = list(project["dependencies"]) + [r for e in sorted(extras) for r in project["optional-dependencies"][e]]
    return [Requirement(r) for r in reqs]


def _dependencies(name: str, extras: set[str]) -> list[Requirement]:
    if name == "kvbounds":
        return own_requirements(extras)
    out = []
    for line in md.distribution(name).requires or []:
        r = Requirement(line)
        if r.marker is None or any(r.marker.evaluate({**default_environment(), "extra": e})
                                   for e in sorted(extras) + [""]):
            out.append(r)
    return out


def brings(commands: list[str]) -> tuple[set[str], set[str]]:
    """(distributions the commands install, those among them missing from this environment), canonical names."""
    got, missing = set(VENV_DEFAULT), set()
    todo: list[tuple[str, set[str]]] = []
    for command in commands:
        reqs, no_deps = parse_command(command)
        for r in map(Requirement, reqs):
            if no_deps:
                got.add(canonicalize_name(r.name))
            else:
                todo.append((r.name, set(r.extras)))
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), frozenset(extras))
        if key in seen:
            continue
        seen.add(key)
        got.add(key[0])
        try:
            deps = _dependencies(name, extras)
        except md.PackageNotFoundError:
            missing.add(key[0])
            continue
        todo += [(r.name, set(r.extras)) for r in deps]
    return got, missing


class Sites:
    """Site-packages folders holding only some of this environment's distributions (links), one per set."""

    def __init__(self, root: Path):
        self.root, self.made = Path(root), {}

    def for_commands(self, commands: list[str]) -> Path:
        names, missing = brings(commands)
        if missing:
            raise LookupError(f"{commands} bring {sorted(missing)}, not installed here")
        key = frozenset(names)
        if key not in self.made:
            self.made[key] = self._build(key, self.root / f"site{len(self.made)}")
        return self.made[key]

    @staticmethod
    def _build(names: frozenset, dest: Path) -> Path:
        dest.mkdir(parents=True)
        for dist in md.distributions():
            if canonicalize_name(dist.metadata["Name"]) not in names:
                continue
            for f in dist.files or ():
                top = f.parts[0]
                if top == ".." or (dest / top).exists():
                    continue                          # scripts (bin/), or a folder two distributions share
                (dest / top).symlink_to(Path(dist.locate_file(top)))
        return dest


def python_argv(site: Path, code: str) -> list[str]:
    """The command that runs ``code`` with only ``site``'s distributions (and the standard library)."""
    return [sys.executable, "-S", "-c", f"import site; site.addsitedir({str(site)!r}); del site\n" + code]
