"""Test-only: arms jobcoord's fault points in a process the test suite starts.

tests/conftest.py puts this directory on PYTHONPATH for every process the tests start, so
Python imports this module at startup. It reads the suite's own variables and hands them to
jobcoord.faults, which itself never reads the environment: an installed jobcoord, started
without this directory on its path, ignores these variables.

    JOBCOORD_FAULT="claim.after_lease:kill"    faults.install(...)
    JOBCOORD_TEST_DEFERRED_WRITES=1            faults.set_deferred_writes(True)
"""

from __future__ import annotations

import os

_spec = os.environ.get("JOBCOORD_FAULT", "")
_deferred = os.environ.get("JOBCOORD_TEST_DEFERRED_WRITES", "") == "1"
if _spec or _deferred:  # import nothing in the common case
    from jobcoord import faults

    faults.install(_spec)
    faults.set_deferred_writes(_deferred)
