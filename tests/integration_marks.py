"""Which tests are integration tests, decided from the code, not from a hand-kept list (a pytest plugin).

A test is marked `integration` (so `make test-fast`, which runs `-m "not integration"`, leaves it out) when
- it or its module or a parameter carries the marker by hand (`pytest.mark.integration`), or
- its own function, or any fixture in its closure, reaches code that starts a process or a server: a call into
  `subprocess`, `multiprocessing`, `os.fork`/`os.system`/..., `asyncio.create_subprocess_*`, a server class from
  `http.server`/`socketserver`/`wsgiref`/`werkzeug.serving`/`uvicorn`, moto's server or Playwright. "Reaches" is
  followed through the names a function's code uses, into the functions and classes of `tests.*` helper modules
  (tests/pg.py's `start_postgres`, tests/moto_server.py's `running_moto_server`, tests/slurm_cluster.py, the
  emulators and fakes...), so a new fixture built on an existing helper is classified without anyone editing a
  list here. Code of the product itself (broker/, providers/...) is not followed: what it runs is under test.

Contract: `starts_a_service(obj)` is a pure function of the object's code; `is_integration(item)` of the item.
A fast pure test wrongly caught here only costs `make test-fast` a test; a slow one it misses shows in the
figure `make test-fast` prints at its end.
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Iterator
from typing import Any

import pytest

# whole modules whose use means a process or a server
SERVICE_MODULES = (
    "subprocess",
    "multiprocessing",
    "concurrent.futures.process",
    "http.server",
    "socketserver",
    "wsgiref.simple_server",
    "werkzeug.serving",
    "uvicorn",
    "moto.server",
    "playwright",
)
# single functions of otherwise harmless modules
SERVICE_CALLS = {
    "os": frozenset({"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnv", "spawnvp",
                     "spawnl", "spawnlp", "execv", "execvp", "execl", "execlp"}),
    "asyncio": frozenset({"create_subprocess_exec", "create_subprocess_shell"}),
    "pty": frozenset({"spawn", "fork"}),
}  # fmt: skip
HELPER_PREFIX = "tests"

_memo: dict[int, bool] = {}


def _in_service_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in SERVICE_MODULES)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _names(func: types.FunctionType) -> set[str]:
    """The global, attribute and imported names its code uses, and its string constants that name a service module
    (`pytest.importorskip("moto.server")`)."""
    names = set()
    for code in _codes(func.__code__):
        names.update(code.co_names)
        names.update(c for c in code.co_consts if isinstance(c, str) and c in SERVICE_MODULES)
    return names


def _functions_of(cls: type) -> Iterator[types.FunctionType]:
    for value in vars(cls).values():
        for candidate in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
            if isinstance(candidate, types.FunctionType):
                yield candidate


def starts_a_service(obj: Any) -> bool:
    """Whether calling `obj` (a function or a class) may start a process or a server, following `tests.*` helpers."""
    key = id(obj)
    if key in _memo:
        return _memo[key]
    _memo[key] = False  # a cycle of helpers calling each other adds nothing
    _memo[key] = found = _starts(obj)
    return found


def _starts(obj: Any) -> bool:
    obj = inspect.unwrap(obj) if callable(obj) else obj
    module = getattr(obj, "__module__", None) or ""
    if _in_service_module(module):
        return True
    if not (module == HELPER_PREFIX or module.startswith(HELPER_PREFIX + ".")):
        return False
    if isinstance(obj, type):  # a server or fake: its own methods, and what it inherits (`http.server`'s classes)
        bases = obj.__mro__[1:]
        return any(starts_a_service(b) for b in bases) or any(starts_a_service(f) for f in _functions_of(obj))
    if not isinstance(obj, types.FunctionType):
        return False
    names = _names(obj)
    if any(_in_service_module(name) for name in names):  # a local `import subprocess` / `from moto.server import`
        return True
    for name in names:
        # a global, or a helper module imported inside the function (`from tests.pg import start_postgres`)
        value = obj.__globals__.get(name) or (_helper_module(name) if name.startswith(HELPER_PREFIX + ".") else None)
        if value is None:
            continue
        if isinstance(value, types.ModuleType):
            if _in_service_module(value.__name__) or names & SERVICE_CALLS.get(value.__name__, frozenset()):
                return True
            # `pg.start_postgres(...)`: the attribute names the code uses, looked up on the module it names
            helpers = value.__name__.startswith(HELPER_PREFIX + ".")
            if helpers and any(starts_a_service(getattr(value, n)) for n in names if callable(getattr(value, n, None))):
                return True
            continue
        if callable(value) and starts_a_service(value):
            return True
    return False


def _helper_module(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception:  # a name that only looks like a module, or one that cannot import here: not followed
        return None


def is_integration(item: pytest.Item) -> bool:
    if item.get_closest_marker("integration"):
        return True
    if isinstance(item, pytest.Function) and starts_a_service(item.obj):
        return True
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if starts_a_service(fixturedef.func):
                return True
    return False


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not item.get_closest_marker("integration") and is_integration(item):
            item.add_marker(pytest.mark.integration)
