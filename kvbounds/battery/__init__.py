"""The battery every error-bound claim, decode claim and method is compared with at equal memory: the controls (zeros,
the mean, StreamingLLM, uniform, each method's ingredient ablation), the power rule that applies the one rule for
"better" (:func:`kvbounds.verdict.paired_calls`) to a claim's records, and the walk probe (:mod:`kvbounds.battery.walk_probe`).

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.presses (the walk probe), kvbounds.verdict (statistics), kvbounds.methods, kvbounds.core,
kvbounds.algorithms; the layers are a contract (tests/package/test_structure.py).
"""
from ._ablations import (COIN_C, random_basis, random_basis_sketch, random_projection_sketch, sketch_basis,
                         split_uniform, subspace_random, subspace_sketch)
from ._controls import (CONTROLS, attention, cache_floats, compression_problem, controls, floats_record,
                        log_partition, method_floats, numerator, relative_error, run, sketch_controls, stream_floats,
                        streaming_llm_indices, uniform_indices)
from ._power_rule import (CONTROL_LABELS, TrivialPower, WorstError, not_applicable, power_on_both_metrics,
                          power_table_cells, power_table_lines, power_vs_controls, practitioner_view, stream_unit,
                          unit_words)
