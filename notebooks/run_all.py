"""Execute the notebooks in place, outputs kept, so a reader sees the figures without running anything.

    python notebooks/run_all.py [NAME ...] [--out DIR] [--profile quick] [--to DIR]

They read the records in ``--out`` (default: ``results/`` at the repository root, what ``make report``
writes; ``KVBOUNDS_OUT`` also sets it) and run only the checks missing there. ``--to DIR`` writes the
executed copies to DIR instead of over the originals. The kernel is this interpreter (a private kernel
spec in a temporary directory), so no kernel needs to be registered. ``make notebooks`` runs this.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KERNEL = "python3"


def kernel_specs(tmp: Path) -> KernelSpecManager:
    (tmp / KERNEL).mkdir(parents=True, exist_ok=True)
    (tmp / KERNEL / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (kvbounds)", "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(tmp)])


def execute(path: Path, target: Path, env: dict, specs: KernelSpecManager, timeout: int) -> None:
    nb = nbformat.read(path, as_version=4)
    km = AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)
    client = NotebookClient(nb, km=km, kernel_name=KERNEL, timeout=timeout,
                            resources={"metadata": {"path": str(HERE)}})   # the kernel starts in notebooks/
    client.execute(env=env)
    nb.metadata.get("kernelspec", {}).update({"name": KERNEL, "display_name": "Python 3"})
    nbformat.write(nb, target)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="notebook names (default: all), e.g. balancekv subgen")
    p.add_argument("--out", default=os.environ.get("KVBOUNDS_OUT") or str(ROOT / "results"))
    p.add_argument("--profile", default=os.environ.get("KVBOUNDS_PROFILE", "quick"))
    p.add_argument("--to", default=None, help="write executed copies here instead of in place")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = p.parse_args(argv)
    paths = sorted(HERE.glob("*.ipynb"))
    if args.names:
        paths = [q for q in paths if q.stem in set(args.names)]
        missing = set(args.names) - {q.stem for q in paths}
        if missing:
            p.error(f"no notebook named {', '.join(sorted(missing))} in {HERE}")
    env = {**os.environ, "KVBOUNDS_OUT": str(Path(args.out).resolve()), "KVBOUNDS_PROFILE": args.profile}
    env.pop("MPLBACKEND", None)
    to = Path(args.to) if args.to else None
    if to:
        to.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        specs = kernel_specs(Path(tmp))
        for path in paths:
            t0 = time.perf_counter()
            print(f"{path.name}: executing (records in {env['KVBOUNDS_OUT']}, profile {args.profile}) ...", flush=True)
            execute(path, (to / path.name) if to else path, env, specs, args.timeout)
            print(f"{path.name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
