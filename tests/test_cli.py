import json

from kvbounds.cli import main


def test_list_check_report(tmp_path, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(cid in out for cid in ("SBW.balance", "SG.reservoir", "FD.covariance", "LB.index"))
    assert main(["check", "MR.memory", "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 0
    assert (tmp_path / "results.jsonl").exists()
    first = (tmp_path / "results.jsonl").read_text().splitlines()
    assert all({"claim", "params", "seed", "backend", "measured", "bound", "holds"} <= json.loads(l).keys() for l in first)
    main(["check", "MR.memory", "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"])
    assert (tmp_path / "results.jsonl").read_text().splitlines() == first      # resumed: nothing recomputed
    assert main(["report", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "MR.memory" in out and (tmp_path / "report.html").exists()


def test_unknown_claim_and_backend(tmp_path, capsys):
    assert main(["check", "NOPE.x", "--out", str(tmp_path)]) == 2
    assert "unknown claim" in capsys.readouterr().err
    assert main(["check", "MR.memory", "--backend", "tpu", "--out", str(tmp_path)]) == 2
