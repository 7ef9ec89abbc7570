"""What a reader sees of a run (issue 25), on a smoke run of the checks whose records used to cite seed labels
("001 shape", "memory 001", "001 paper c"): its CLI output, report, summary.json and the text drawn in its
figures hold no seed number used as a citation; every figure has axis labels of its own claim and alt text."""
import re

import pytest

from kvbounds.cli import main

SEED_CITATION = re.compile(r"(?<!\.)\b00[0-4] ")    # the issue's `grep -rE "\b00[0-4] "`, less decimals ("10.000 ")
CLAIMS = ["BKV.attention", "BKV.memory", "MR.error"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """(output dir, CLI output, every text artist of every figure the report saved)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.text import Text
    texts: list[str] = []
    save = Figure.savefig

    def spy(self, *a, **k):
        texts.extend(t.get_text() for t in self.findobj(Text))
        return save(self, *a, **k)
    out = tmp_path_factory.mktemp("smoke") / "results"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", spy)
        cap = _Capture()
        with cap:
            assert main(["check", *CLAIMS, "--profile", "smoke", "--out", str(out), "--workers", "1"]) == 0
            assert main(["report", "--out", str(out)]) == 0
            assert main(["show", "MR.error", "--out", str(out)]) == 0
    return out, cap.text, texts


class _Capture:
    """stdout and stderr of the CLI, in a module-scoped fixture (capsys is function-scoped)."""
    def __enter__(self):
        import contextlib
        import io
        self.buf = io.StringIO()
        self._ctx = contextlib.ExitStack()
        self._ctx.enter_context(contextlib.redirect_stdout(self.buf))
        self._ctx.enter_context(contextlib.redirect_stderr(self.buf))
        return self

    def __exit__(self, *exc):
        self._ctx.close()
        self.text = self.buf.getvalue()
        return False


def test_no_seed_number_cited_in_cli_report_summary_or_figures(smoke_run):
    out, cli, figure_text = smoke_run
    assert figure_text and any("BalanceKV-NeurIPS" in t for t in figure_text)
    texts = {"CLI output": cli, "report.html": (out / "report.html").read_text(),
             "summary.json": (out / "summary.json").read_text(), "figure text": "\n".join(figure_text)}
    for where, text in texts.items():
        hits = [text[max(m.start() - 40, 0): m.end() + 20] for m in SEED_CITATION.finditer(text)]
        assert not hits, f"{where} cites papers by seed number: {hits[:5]}"
    assert "BalanceKV-NeurIPS shape" in texts["summary.json"]


def test_every_figure_has_its_claims_axis_labels_and_alt_text(smoke_run):
    out, _, figure_text = smoke_run
    html = (out / "report.html").read_text()
    imgs = re.findall(r'<img src="(figures/[^"]+)" alt="([^"]*)"', html)
    assert len(imgs) >= len(CLAIMS)
    for src, alt in imgs:
        assert (out / src).exists()
        cid = src.split("/")[1].rsplit("_", 1)[0]
        m = re.search(r"y axis: (.+); x axis: (.+?)(;|$)", alt)
        assert alt.startswith(cid + ": ") and m and m.group(1).strip() and m.group(2).strip(), alt
        assert "norm bound or rank" not in alt and "norm bound or rank" not in "\n".join(figure_text)
    assert "t (batch size, tokens)" in figure_text and "n (tokens in the stream)" in figure_text
