"""The report: verdicts from the stored records as a terminal table, ``summary.json``, ``report.html`` (templates/) with
its figures, and markdown (``python -m kvbounds.report.markdown``; ``python -m kvbounds.report.summary_read`` reads
summary.json back); the glossary, the papers' answers and the practitioner's table; the per-paper answers in plain
sentences and the decision map, read from summary.json (``answers_by_paper``, ``decision_map``).

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.battery, kvbounds.e2e, kvbounds.verdict, kvbounds.run, kvbounds.methods, kvbounds.core, kvbounds.claims,
kvbounds.algorithms; the layers are a contract (tests/package/test_structure.py).
"""
from ._answers import paper_answers as answers_by_paper
from ._decisions import decisions as decision_map
from ._glance import dimensions
from ._leaderboard import board_table
from ._report import ReportError, build_verdicts, headline, render_terminal, source_path, write_report
from ._words import what_the_records_show

__all__ = ["dimensions", "board_table", "ReportError", "build_verdicts", "headline", "render_terminal", "source_path",
           "write_report", "what_the_records_show"]
