"""Property test over the served OpenAPI document: with a valid token of each role, generated
requests (valid and invalid) to every operation never get a 5xx, and every answer (status,
content type, body) matches the document. A bounded number of examples per operation keeps
it under a minute."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.service import Coordinator
from tests.serve_procs import served, tokens_for

EXAMPLES_PER_OPERATION = 6


def _cap_wait(case: Any) -> Any:
    # A long-poll may rightly wait up to 30 s; the property is about answers, not waits.
    if isinstance(case.body, dict) and isinstance(case.body.get("wait"), int | float):
        case.body["wait"] = min(case.body["wait"], 0.1)
    return case


def test_every_operation_answers_per_its_schema_for_every_role(sqlite_target: Target) -> None:
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    target = sqlite_target
    secrets = dict(zip(("submitter", "viewer", "worker", "operator"), tokens_for(target, [
        ("sub", "submitter", "alice", None), ("view", "viewer", "alice", None),
        ("wa", "worker", None, "wa"), ("op", "operator", None, None)]), strict=True))
    with Coordinator.open(target) as c:
        c.enqueue_many([{"kind": "k", "tenant": "alice" if i % 2 else "bob"}
                        for i in range(50)])
    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance]
    failures: list[str] = []
    with served(target, "--reap-every", "1") as s:
        schema = schemathesis.openapi.from_url(f"{s.url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 15
        def runner(strategy: Any, headers: dict[str, str]) -> Any:
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), derandomize=True)
            @given(case=strategy)
            def check(case: Any) -> None:
                case.call_and_validate(base_url=s.url, headers=headers, checks=checks,
                                       timeout=30)
            return check

        for role, secret in secrets.items():
            headers = {"Authorization": f"Bearer {secret}"}
            for op, mode in itertools.product(operations, (GenerationMode.POSITIVE,
                                                            GenerationMode.NEGATIVE)):
                try:
                    runner(op.as_strategy(generation_mode=mode).map(_cap_wait), headers)()
                except Unsatisfiable:
                    assert mode is GenerationMode.NEGATIVE  # nothing to make invalid
                except Exception as e:
                    failures.append(f"{role} {op.method.upper()} {op.path}: "
                                    f"{type(e).__name__}: {str(e)[:600]}")
    assert not failures, "\n\n".join(failures)
