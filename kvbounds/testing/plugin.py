"""The pytest plugin ``kvbounds`` (installed with the package as the ``pytest11`` entry point; ``-p no:kvbounds``
turns it off).

Fixtures:
  * ``kv_stream``        a :class:`~kvbounds.streams.KVStream`; a test that takes it runs once per family
                         of the profile's list (its id is the family), on a stream sized by the profile;
  * ``real_trace``       a slice of a cached real trace, once per model (SmolLM2, MiniLM), skipped with the reason
                         when the model is missing here;
  * ``kvbounds_profile`` the profile's name.
Option: ``--kvbounds-profile smoke|quick|full`` (default smoke; or the ``KVBOUNDS_PROFILE`` environment
variable): the streams' sizes (:data:`SIZES`), and whether checks marked slow run.
Marker: ``@pytest.mark.kvbounds_slow``: a slow check, skipped on the smoke profile (say why in its reason).
"""
from __future__ import annotations

import os

import pytest

PROFILES = ("smoke", "quick", "full")
# (n, d) of the kv_stream / real_trace streams per profile
SIZES = {"smoke": (64, 8), "quick": (256, 16), "full": (1024, 64)}


def pytest_addoption(parser):
    group = parser.getgroup("kvbounds", "kvbounds: KV streams and compressor checks")
    group.addoption("--kvbounds-profile", choices=PROFILES, default=None,
                    help="sizes of the kv_stream / real_trace fixtures; smoke skips checks marked kvbounds_slow "
                         "(default: $KVBOUNDS_PROFILE or smoke)")


def profile_of(config) -> str:
    value = config.getoption("--kvbounds-profile", default=None) or os.environ.get("KVBOUNDS_PROFILE") or "smoke"
    if value not in PROFILES:
        raise pytest.UsageError(f"kvbounds profile must be one of {PROFILES}, got {value!r}")
    return value


def pytest_configure(config):
    config.addinivalue_line("markers", "kvbounds_slow: a slow compressor check, run on the kvbounds profiles "
                                       "quick and full (skipped on smoke)")


def pytest_collection_modifyitems(config, items):
    profile = profile_of(config)
    if profile != "smoke":
        return
    skip = pytest.mark.skip(reason="slow check (kvbounds_slow): run with --kvbounds-profile quick or full")
    for item in items:
        if item.get_closest_marker("kvbounds_slow") is not None:
            item.add_marker(skip)


def pytest_generate_tests(metafunc):
    if "kv_stream" in metafunc.fixturenames and not _parametrized(metafunc, "kv_stream"):
        from kvbounds.streams import SYNTHETIC
        metafunc.parametrize("kv_stream", SYNTHETIC, indirect=True, ids=[f.replace(" ", "-") for f in SYNTHETIC])
    if "real_trace" in metafunc.fixturenames and not _parametrized(metafunc, "real_trace"):
        from kvbounds.streams import REAL
        metafunc.parametrize("real_trace", REAL, indirect=True, ids=[f.split()[1] for f in REAL])


def _parametrized(metafunc, name: str) -> bool:
    return any(name in m.args[0] if isinstance(m.args[0], str) else False
               for m in metafunc.definition.iter_markers("parametrize"))


@pytest.fixture
def kvbounds_profile(request) -> str:
    """The kvbounds profile of this session (--kvbounds-profile)."""
    return profile_of(request.config)


@pytest.fixture
def kv_stream(request):
    """A synthetic KV stream of the family in ``request.param`` (every synthetic family in turn by default; a
    test may parametrize ``kv_stream`` indirectly with its own family names), n and d from the profile, seed 0."""
    from kvbounds.streams import make_stream
    n, d = SIZES[profile_of(request.config)]
    return make_stream(request.param, n, d, seed=0)


@pytest.fixture
def real_trace(request):
    """A slice of a cached real trace of the family in ``request.param`` ("real SmolLM2", "real MiniLM"): n tokens
    from the profile, the model's d, seed 0; skipped with the reason when the model is missing here."""
    from kvbounds.streams import make_stream, real_available
    why = real_available(request.param)
    if why:
        pytest.skip(f"{request.param}: {why}")
    n, _ = SIZES[profile_of(request.config)]
    return make_stream(request.param, n, seed=0)
