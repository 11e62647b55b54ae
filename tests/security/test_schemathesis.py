"""The admin API against its own OpenAPI description: no 5xx, and no status the spec does not list.

schemathesis reads ``/openapi.json`` from a real ``imds serve`` (with the admin token: the
description is private) and drives every documented operation with generated requests,
valid ones and invalid ones (negative mode). Examples are bounded and derandomized, so a
run is deterministic and takes seconds. (Its pytest plugin does not run on pytest 9 yet,
so the operations are driven through its Python API.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from serve_process import Server, serving

EXAMPLES = 25  # per operation and mode


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("schemathesis"), "--db", "memory://") as running:
        yield running


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_every_answer_is_documented_and_none_is_a_server_error(server, mode):
    """Each generated request (admin token attached) gets a status listed for its operation, never a 5xx."""
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=server.admin_headers)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12, [op.label for op in operations]
    seen: dict[str, set[int]] = {}

    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def exercise(case: schemathesis.Case) -> None:
            response = case.call(base_url=server.url, headers=server.admin_headers)
            seen.setdefault(case.operation.label, set()).add(response.status_code)
            case.validate_response(response, checks=[not_a_server_error, status_code_conformance])

        try:
            exercise()
        except Unsatisfiable:
            # Nothing to get wrong: a path parameter is a string whatever it holds, and some operations have no body.
            assert mode is GenerationMode.NEGATIVE, operation.label
    exercised = {op.label for op in operations if mode is GenerationMode.POSITIVE or op.body}
    assert exercised <= set(seen), exercised - set(seen)
