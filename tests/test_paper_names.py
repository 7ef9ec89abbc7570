"""Papers by their short names wherever a person reads (issue 25): a smoke run of the checks whose records used to
cite seed labels ("001 shape", "memory 001", "001 paper c"), then its CLI output, report, summary.json and the
text drawn in its figures (titles, axis labels, legends) hold no seed number used as a citation."""
import re

import pytest

from kvbounds.cli import main

SEED_CITATION = re.compile(r"\b00[0-4] ")          # the issue's `grep -rE "\b00[0-4] "`
CLAIMS = ["BKV.attention", "BKV.memory", "MR.error"]


@pytest.fixture
def figure_text(monkeypatch):
    """Every text artist of every figure the report saves."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.text import Text
    texts: list[str] = []
    save = Figure.savefig

    def spy(self, *a, **k):
        texts.extend(t.get_text() for t in self.findobj(Text))
        return save(self, *a, **k)
    monkeypatch.setattr(Figure, "savefig", spy)
    return texts


def test_no_seed_number_cited_in_cli_report_summary_or_figures(tmp_path, capsys, figure_text):
    out = tmp_path / "results"
    assert main(["check", *CLAIMS, "--profile", "smoke", "--out", str(out), "--workers", "1"]) == 0
    assert main(["report", "--out", str(out)]) == 0
    assert main(["show", "MR.error", "--out", str(out)]) == 0
    cli = capsys.readouterr()
    assert figure_text and any("BalanceKV-NeurIPS" in t for t in figure_text)
    texts = {"CLI output": cli.out + cli.err, "report.html": (out / "report.html").read_text(),
             "summary.json": (out / "summary.json").read_text(), "figure text": "\n".join(figure_text)}
    for where, text in texts.items():
        hits = [text[max(m.start() - 40, 0): m.end() + 20] for m in SEED_CITATION.finditer(text)]
        assert not hits, f"{where} cites papers by seed number: {hits[:5]}"
    assert "BalanceKV-NeurIPS shape" in texts["report.html"] or "BalanceKV-NeurIPS shape" in texts["summary.json"]
