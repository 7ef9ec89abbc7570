"""Print the per-entry table of a fuzz run: ``KVBOUNDS_FUZZ_TABLE=DIR pytest -m fuzz tests/fuzz/test_fuzz.py`` writes
one
JSON tally per entry to DIR; ``python tests/fuzz/fuzz_table.py DIR [EXAMPLES]`` prints calls, silent NaN/Inf, wrong
answers, hangs and unclear crashes per entry point (issue 24's closing table) and the totals."""
from __future__ import annotations

import glob
import json
import os
import sys


def table(where: str, examples: int | None = None) -> str:
    rows = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(where, "*.json")))]
    rows = [r for r in rows if examples is None or r["examples"] == examples]
    w = max([len(r["entry"]) for r in rows] + [11])
    head = f"{'entry point':<{w}}  {'calls':>6}  {'clear':>6}  {'NaN/Inf':>7}  {'wrong':>5}  {'hangs':>5}  {'unclear':>7}  owner"
    lines = [head, "-" * len(head)]
    tot = dict(calls=0, clear=0, nan=0, wrong=0, hang=0, unclear=0)
    for r in rows:
        for k in tot:
            tot[k] += r[k]
        lines.append(f"{r['entry']:<{w}}  {r['calls']:>6}  {r['clear']:>6}  {r['nan']:>7}  {r['wrong']:>5}  "
                     f"{r['hang']:>5}  {r['unclear']:>7}  {r['owner'] or ''}")
    lines.append(f"{'total (' + str(len(rows)) + ' entries)':<{w}}  {tot['calls']:>6}  {tot['clear']:>6}  "
                 f"{tot['nan']:>7}  {tot['wrong']:>5}  {tot['hang']:>5}  {tot['unclear']:>7}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None))
