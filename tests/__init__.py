"""amdgpu_virt tests.

Hypothesis runs derandomized so that CI is reproducible; set
HYPOTHESIS_PROFILE=explore for a randomized, longer search.
"""

import os

from hypothesis import HealthCheck
from hypothesis import settings

settings.register_profile(
    'default', max_examples=200, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    'explore', max_examples=5000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get('HYPOTHESIS_PROFILE', 'default'))
