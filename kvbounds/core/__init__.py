"""What every job stands on: the record of a trial and the append-only store that holds it (``ResultStore``), output
files written without ever losing a record (``write_output``), and a sweep's progress and run log.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.claims (the papers' names, for old records) and kvbounds.algorithms (``InputError``); the layers are a
contract (tests/package/test_structure.py).
"""
from ._output_files import (OutputRefused, check_output, check_output_dir, special_file, store_file,
                            write_output)
from ._progress import Progress, append_run, duration, read_runs
from ._records import (DEFERRED, FIGURES_DIR, REPORT_FILES, RESULTS_FILE, STORE_FILE, Record, ResultStore,
                       StoreError, StoreOfOtherCommand, canonical, jsonable, special_kind, store_writer, trial_key)
from ._trials import make_record, pick, unit_directions

__all__ = ["OutputRefused", "check_output", "check_output_dir", "special_file", "store_file", "write_output",
           "Progress", "append_run", "duration", "read_runs", "DEFERRED", "FIGURES_DIR", "REPORT_FILES", "RESULTS_FILE",
           "STORE_FILE", "Record", "ResultStore", "StoreError", "StoreOfOtherCommand", "canonical", "jsonable",
           "special_kind", "store_writer", "trial_key", "make_record", "pick", "unit_directions"]
