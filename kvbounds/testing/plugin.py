"""The pytest plugin ``kvbounds`` (installed with the package as the ``pytest11`` entry point; ``-p no:kvbounds``
turns it off).

Fixtures, each named ``kvbounds_...`` so that no other project's fixture is taken over (a project's own
``kv_stream`` or ``real_trace`` fixture stays its own, and its tests run as without the plugin):
  * ``kvbounds_stream``      a :class:`~kvbounds.streams.KVStream`; a test that takes it runs once per
                             synthetic family (its id is the family), on a stream sized by the profile; a test may
                             parametrize ``kvbounds_stream`` (indirectly) with its own family names;
  * ``kvbounds_real_trace``  a slice of a cached real trace, once per model (SmolLM2, MiniLM), skipped with the
                             reason when the model is missing here or its traces are not prepared (the reason
                             gives the one command that prepares them);
  * ``kvbounds_profile``     the profile's name.
Option: ``--kvbounds-profile smoke|quick|full`` (default smoke; or the ``KVBOUNDS_PROFILE`` environment
variable): the streams' sizes (:data:`SIZES`), and whether checks marked slow run.
Marker: ``@pytest.mark.kvbounds_slow``: a slow check, skipped on the smoke profile (say why in its reason).

Manners: the plugin never fails, slows or changes a session that does not use it. Loading it imports pytest and
the family names only (numpy when a fixture is used); its collection hook looks only at tests marked
``kvbounds_slow``. An unknown ``KVBOUNDS_PROFILE`` (the notebooks set it too, e.g. ``gpu``) is not an error: a
session that uses the plugin gets a warning line in its summary and the smoke profile for ``kvbounds_slow``; only a
test that requests a kvbounds fixture fails, with one line saying why.
"""
from __future__ import annotations

import os

import pytest

from kvbounds.streams import REAL, SYNTHETIC

__all__ = ["PROFILES", "SIZES", "FIXTURES", "pytest_addoption", "profile_of", "pytest_configure",
           "pytest_collection_modifyitems", "pytest_terminal_summary", "kvbounds_profile", "kvbounds_stream",
           "kvbounds_real_trace"]

PROFILES = ("smoke", "quick", "full")
# (n, d) of the kvbounds_stream / kvbounds_real_trace streams per profile
SIZES = {"smoke": (64, 8), "quick": (256, 16), "full": (1024, 64)}
FIXTURES = ("kvbounds_stream", "kvbounds_real_trace", "kvbounds_profile")
_USED = pytest.StashKey[bool]()


def pytest_addoption(parser):
    group = parser.getgroup("kvbounds", "kvbounds: KV streams and compressor checks")
    group.addoption("--kvbounds-profile", choices=PROFILES, default=None,
                    help="sizes of the kvbounds_stream / kvbounds_real_trace fixtures; smoke skips checks marked "
                         "kvbounds_slow (default: $KVBOUNDS_PROFILE or smoke)")


def _profile(config) -> tuple[str, str]:
    """(profile, problem): ``--kvbounds-profile``, else ``$KVBOUNDS_PROFILE``, else smoke; ``problem`` says why the
    environment's value was not used ("" when it was, or when none is set), and the profile is then smoke."""
    value = config.getoption("--kvbounds-profile", default=None)
    if value:
        return value, ""
    env = os.environ.get("KVBOUNDS_PROFILE", "")
    if not env or env in PROFILES:
        return env or "smoke", ""
    return "smoke", f"KVBOUNDS_PROFILE={env!r} is no kvbounds profile (one of {', '.join(PROFILES)})"


def profile_of(config) -> str:
    """The profile of a test that requests a kvbounds fixture: an unknown ``KVBOUNDS_PROFILE`` fails that test, in
    one line (``--kvbounds-profile`` or a valid value fixes it)."""
    profile, problem = _profile(config)
    if problem:
        pytest.fail(f"{problem}; set it to one of them or pass --kvbounds-profile", pytrace=False)
    return profile


def pytest_configure(config):
    config.addinivalue_line("markers", "kvbounds_slow: a slow compressor check, run on the kvbounds profiles "
                                       "quick and full (skipped on smoke)")


def pytest_collection_modifyitems(config, items):
    slow = [item for item in items if item.get_closest_marker("kvbounds_slow") is not None]
    config.stash[_USED] = bool(slow) or any(name in FIXTURES for item in items
                                            for name in getattr(item, "fixturenames", ()))
    if not slow:
        return
    profile, problem = _profile(config)
    if profile != "smoke":
        return
    why = f"; {problem}: smoke used" if problem else ""
    skip = pytest.mark.skip(reason=f"slow check (kvbounds_slow): run with --kvbounds-profile quick or full{why}")
    for item in slow:
        item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The warning of an unknown ``KVBOUNDS_PROFILE``, in a session that uses the plugin only."""
    if config.stash.get(_USED, False):
        _, problem = _profile(config)
        if problem:
            terminalreporter.write_line(f"kvbounds: warning: {problem}: ignored (smoke) by tests marked "
                                        "kvbounds_slow; tests that request a kvbounds fixture fail", yellow=True)


@pytest.fixture
def kvbounds_profile(request) -> str:
    """The kvbounds profile of this session (--kvbounds-profile)."""
    return profile_of(request.config)


@pytest.fixture(params=SYNTHETIC, ids=[f.replace(" ", "-") for f in SYNTHETIC])
def kvbounds_stream(request):
    """A synthetic KV stream of the family in ``request.param`` (every synthetic family in turn by default; a
    test may parametrize ``kvbounds_stream`` indirectly with its own family names), n and d from the profile,
    seed 0."""
    from kvbounds.streams import make_stream
    n, d = SIZES[profile_of(request.config)]
    return make_stream(request.param, n, d, seed=0)


@pytest.fixture(params=REAL, ids=[f.split()[1] for f in REAL])
def kvbounds_real_trace(request):
    """A slice of a cached real trace of the family in ``request.param`` ("real SmolLM2", "real MiniLM"): n tokens
    from the profile, the model's d, seed 0; skipped with the reason when the model is missing here."""
    from kvbounds.streams import make_stream, real_prepared
    profile = profile_of(request.config)
    why = real_prepared(request.param)          # never extracted inside a test: the one command to prepare it
    if why:
        pytest.skip(f"{request.param}: {why}")
    n, _ = SIZES[profile]
    return make_stream(request.param, n, seed=0)
