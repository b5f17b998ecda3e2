"""The API contract: schemathesis generates requests from the live server's /openapi.json and
checks every answer: no 5xx, status codes the schema documents, the documented content types,
and bodies that match the response schemas.

Uploads: a schema cannot say "audio", so every other generated upload carries a real 2 s clip
instead of the random bytes (those decode to a transcript, the random ones to a 415); the rest of
the form (model, language, prompt, temperature, beam size, formats, stream, ...) is as generated.
`positive_data_acceptance` is therefore left out: random bytes are valid per the schema and are
still rightly refused. Bounded to `EXAMPLES` cases per operation (~1 min on tiny.en). Driven
through the Python API: schemathesis' pytest plugin does not work with pytest 9. On a server of
its own: the generated requests may unload a model (`DELETE /v1/models/{id}` with an id that
names one), which must not change the shared server the other modules read.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup

from tests.api.conftest import AUDIO, LiveServer, start_server, stop_server

pytestmark = pytest.mark.timeout(300)

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "50"))
SHORT_CLIP = (AUDIO / "1089-134691-0000.flac").read_bytes()  # 2.1 s of speech
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
_uploads = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("contract"), "contract")
    yield live
    stop_server(live)


def test_api_contract(server: LiveServer) -> None:
    """Every operation of the schema, `EXAMPLES` generated cases each; all failures reported."""
    schema = schemathesis.openapi.from_url(server.url("/openapi.json"))
    failures: dict[str, str] = {}
    statuses: dict[str, list[int]] = {}  # the answers seen, per operation
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 5, [op.label for op in operations]
    for operation in operations:

        @given(
            case=operation.as_strategy(GenerationMode.POSITIVE)
            | operation.as_strategy(GenerationMode.NEGATIVE)
        )
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        )
        def check(case: schemathesis.Case) -> None:
            negative = case.meta is not None and case.meta.generation.mode.is_negative
            upload = isinstance(case.body, dict) and "file" in case.body
            if upload and not negative and next(_uploads) % 2 == 0:
                case.body["file"] = SHORT_CLIP
            checks = [*CHECKS, negative_data_rejection] if negative else CHECKS
            response = case.call_and_validate(checks=checks, timeout=120)
            statuses.setdefault(case.operation.label, []).append(response.status_code)

        try:
            check()
        except FailureGroup as e:  # keep going, report them all
            failures[operation.label] = "\n".join(
                f"{type(f).__name__}: {f.title}: {f.message[:300]}" for f in e.exceptions
            )
    for label, seen in statuses.items():
        print(f"{label}: {len(seen)} cases, statuses {sorted(set(seen))}")
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
