"""uniform_control: uniform sampling again from its own random stream, the end-to-end checks' null control."""
from __future__ import annotations

from kvbounds.methods import Method

from .uniform import compress

__all__ = ["compress", "METHOD"]

# the same contract function as uniform's (kvbounds.catalog.uniform): a null control repeats its method
METHOD = Method("uniform_control", compress, role="control", control_of="uniform", randomized=True,
                label="uniform sampling again from its own random stream: the end-to-end checks' null control")
