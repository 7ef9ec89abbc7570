"""conftest.LONGEST_FIRST names tests that exist (a renamed test would silently lose its early start)."""
import re
from pathlib import Path

from conftest import LONGEST_FIRST

ROOT = Path(__file__).resolve().parents[2]


def test_longest_first_names_existing_tests():
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    for nodeid in LONGEST_FIRST:
        path, name = nodeid.split("::")
        func = re.sub(r"\[.*\]$", "", name)
        assert re.search(rf"^def {func}\(", (ROOT / path).read_text(), re.M), nodeid
