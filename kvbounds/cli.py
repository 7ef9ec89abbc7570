"""Command line: ``kvbounds list | check | report``."""
from __future__ import annotations

import argparse
import sys

from .registry import CLAIMS
from .runner import PROFILES


def _cmd_list(args) -> int:
    from .records import ResultStore
    done = {}
    if args.out:
        for r in ResultStore(args.out).load():
            done.setdefault(r.claim, 0)
            done[r.claim] += 1
    width = max(map(len, CLAIMS))
    for c in CLAIMS.values():
        status = "check" if c.has_check else "no check yet"
        if c.id in done:
            status += f", {done[c.id]} record(s)"
        print(f"{c.id:<{width}}  {c.family:<18} {status:<26} {c.source}")
    return 0


def _cmd_check(args) -> int:
    """Run the checks, then print the verdict of each claim run. Ctrl-C or SIGTERM: one line saying
    how to resume, exit 130 / 143. An unusable --out (read-only, a file, full disk, another `check`
    writing there): one line, exit 1; the trials already written stay valid."""
    from .records import ResultStore, StoreError
    from .registry import checked_claims, get_claim
    from .report import build_verdicts
    from .runner import Terminated, run_checks, sigterm_raises
    for cid in args.claims:
        try:
            get_claim(cid)
        except KeyError as e:
            print(f"kvbounds: {e.args[0]}", file=sys.stderr)
            return 2
    resume = f"finished trials are kept in {args.out}/results.jsonl; rerun the same command to resume"
    try:
        with sigterm_raises():
            recs = run_checks(args.claims or None, profile=args.profile, seed=args.seed, backend=args.backend,
                              out=args.out, workers=args.workers, progress=not args.quiet)
    except KeyboardInterrupt:
        print(f"kvbounds: interrupted; {resume}", file=sys.stderr)
        return 130
    except Terminated:
        print(f"kvbounds: terminated; {resume}", file=sys.stderr)
        return 143
    except StoreError as e:
        print(f"kvbounds: error: {e}", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError) as e:
        print(f"kvbounds: {e}", file=sys.stderr)
        return 2
    ids = list(dict.fromkeys(args.claims)) or [c.id for c in checked_claims()]
    store = ResultStore(args.out)
    verdicts = build_verdicts([r for r in store.load() if r.claim in ids])
    width = max(map(len, ids))
    for cid in ids:
        v = verdicts[cid]
        text = f"{v.headline or v.status}: {' '.join(v.summary.split())}"
        print(f"{cid:<{width}}  {text[:110] + '...' if len(text) > 113 else text}")
    errors = [e for e in store.errors() if e.claim in ids]
    failed = f"; {len(errors)} trial(s) failed with an error (retried by the next `check`)" if errors else ""
    print(f"kvbounds: wrote {len(recs)} record(s) to {store.path}{failed}; details: `kvbounds report --out {args.out}`")
    return 0


def _executor(workers):
    if workers is None:
        return None
    from .runner import default_executor
    return default_executor(workers)


def _cmd_report(args) -> int:
    from .report import write_report, build_verdicts, render_terminal
    from .records import ResultStore
    html = write_report(args.out)
    print(render_terminal(build_verdicts(ResultStore(args.out).load())))
    print(f"\nreport: {html}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvbounds", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("list", help="list registered claims and their status")
    pl.add_argument("--out", default=None, help="also count records in DIR/results.jsonl")
    pc = sub.add_parser("check", help="run claim checks, appending records to DIR/results.jsonl")
    pc.add_argument("claims", nargs="*", metavar="CLAIM_ID")
    pc.add_argument("--profile", choices=PROFILES, default="quick")
    pc.add_argument("--backend", default="numpy", help="numpy | torch | torch:cpu | torch:cuda | cupy")
    pc.add_argument("--seed", type=int, default=0)
    pc.add_argument("--out", default="results")
    pc.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    pc.add_argument("--quiet", action="store_true")
    pr = sub.add_parser("report", help="turn the records into report.html + figures + terminal summary")
    pr.add_argument("--out", default="results")
    traces_cli = _traces_cli()
    if traces_cli is not None:
        traces_cli.add_parser(sub)          # `kvbounds traces extract ...` (real Q/K/V from real models)
    return p


def _traces_cli():
    import importlib.util
    if importlib.util.find_spec("kvbounds.traces.cli") is None:
        return None
    import kvbounds.traces.cli
    return kvbounds.traces.cli


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "traces":
        return _traces_cli().run(args)
    return {"list": _cmd_list, "check": _cmd_check, "report": _cmd_report}[args.cmd](args)
