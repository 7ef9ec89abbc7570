"""What a reader of a fresh clone meets beside the docs: the notebooks' committed outputs name no machine's paths,
and the CHANGELOG counts the claims the registry holds."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvbounds import claims as registry

ROOT = Path(__file__).resolve().parents[2]
MACHINE_PATHS = re.compile(r"(?<![\w.])/(?:tmp|work|root|home)/")


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_outputs_name_no_machine_path(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = [m.group(0) for cell in nb["cells"] for out in cell.get("outputs", [])
             for m in [MACHINE_PATHS.search(json.dumps(out))] if m]
    assert not found, f"{path.name}: an output prints a path of the machine it ran on"


def test_changelog_counts_the_registry():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    first = re.search(r"First version: (\d+) claims", text)
    assert first and int(first.group(1)) == len(registry.CLAIMS)
