"""Shared pytest setup: the test helpers (sim, oracle, strategies_gen) import as top-level modules,
and hypothesis runs without deadlines (the replay simulator is plain Python)."""

import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

from taps.verify import simulate_cpu_devices

# Before any test imports JAX: the verification tests run plans on up to 64 simulated devices.
simulate_cpu_devices(64)

sys.path.insert(0, str(Path(__file__).parent))

settings.register_profile(
    "taps",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("taps")
