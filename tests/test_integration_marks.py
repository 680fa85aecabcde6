"""tests/integration_marks.py tells the tests that start a process or a server (left out of `make test-fast`) from
the pure ones by following their code into the test helpers."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

from tests.integration_marks import starts_a_service
from tests.moto_server import running_moto_server


def _pure(x: int) -> int:
    return sorted([x, 1])[0]


def _runs_a_tool() -> None:
    subprocess.run(["true"], check=True)


def _starts_moto_through_the_helper() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


def _imports_postgres_inside() -> object:
    from tests.pg import start_postgres

    return start_postgres()


def _through_another_helper() -> None:
    _runs_a_tool()


def _serves_in_a_thread() -> None:
    import http.server

    http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler).server_close()


def test_code_that_starts_a_process_or_a_server_is_found() -> None:
    for found in (
        _runs_a_tool,
        _starts_moto_through_the_helper,
        _imports_postgres_inside,
        _through_another_helper,
        _serves_in_a_thread,
    ):
        assert starts_a_service(found), found.__name__


def test_pure_code_is_not_taken_for_a_service() -> None:
    assert not starts_a_service(_pure)
    assert not starts_a_service(test_pure_code_is_not_taken_for_a_service)


def test_the_suites_own_fixtures_are_classified() -> None:
    import tests.conftest as conftest

    assert starts_a_service(conftest.postgres._get_wrapped_function())  # type: ignore[attr-defined]
    assert starts_a_service(conftest.cluster._get_wrapped_function())  # type: ignore[attr-defined]
    assert not starts_a_service(conftest.clock._get_wrapped_function())  # type: ignore[attr-defined]
    assert not starts_a_service(conftest.make_runtime._get_wrapped_function())  # type: ignore[attr-defined]
