"""AWS Lambda entry point: `handler(event, context)` for every way the serverless deployment (terraform/) calls in.

Dispatch is by the event's shape, before Mangum (which only understands HTTP events):
- API Gateway (HTTP API payload 2.0; any event with a `requestContext`, which Mangum also reads for REST API v1 and
  ALB): Mangum → the FastAPI app, with lifespan off (the runtime is built here, once per container).
- EventBridge Scheduler: the schedule's Input `{"overspill_task": NAME}` → `TASKS[NAME](runtime, now)`, which returns
  a JSON-able summary. "tick" runs every tick step except refresh_prices and run_due_reports; "refresh_prices"
  asks every configured feed now and "reports" runs the report schedules that are due (each has its own schedule,
  so a long price refresh or report never delays a tick). A name in
  `PENDING_TASKS` is scheduled by the module but its code lands with its own feature: it raises `TaskUnavailable`
  (the invocation fails visibly) until it is added to `TASKS`. Any other name raises `ValueError`.
- SQS (`Records` from `aws:sqs`): each body, an EventBridge "EC2 Spot Instance Interruption Warning" or "EC2 Instance
  Rebalance Recommendation" (raw or in an SNS envelope), is parsed by `providers.aws.notice_from_message_body` and
  acted on by `broker.loop.interrupts.apply_notice`: the same code the tick's interruption step runs on the messages
  it polls. Returns `{"batchItemFailures": [{"itemIdentifier": messageId}, ...]}` (the event source mapping has
  ReportBatchItemFailures) for records whose handling raised, so only those are redelivered (then dead-lettered).
  Malformed bodies and other event types are logged and acknowledged, as the polling path drops them: no retry can
  fix them. Notices are at-least-once; a repeat is a no-op.
- Anything else raises `ValueError`.

Cold start: `Settings()` from the environment, with `serverless=True` (a Lambda container's disk is ephemeral and
private to it, so report destinations of type `directory` are refused: `broker.finance.reports.deliver`); when
`OVERSPILL_DATABASE_SECRET_ARN` is set (and `OVERSPILL_DATABASE_URL` is not) the database URL is built from that
Secrets Manager secret (`username`, `password`, and `host`/`port`/`dbname` when the secret has them, else
`OVERSPILL_DATABASE_HOST`/`_PORT`/`_NAME`).
`build_runtime` then migrates under PostgreSQL's advisory lock, so concurrent cold starts are safe: one upgrades,
the others wait and find nothing to do. The runtime and the Mangum app are built once per container (module-level
cache guarded by a lock) and reused by every warm invocation.

Rotation: RDS rotates the password of its managed secret while containers live on. Pooled connections stay
authenticated, but a new one (pool recycle, a dropped connection, a resumed database) would present the old
password. `SecretCredentials` supplies every new connection's credentials (SQLAlchemy `do_connect`); when PostgreSQL
refuses them with an authentication error it re-reads the secret once and, if the secret now holds other
credentials, connects again with them (else the error stands: no loop, at most one extra secret read per refused
connection). The next invocation then rebuilds the container's Mangum app with the new URL (`runtime.settings`
and the rate limiter's own connections follow); the engine and its pool are kept.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url

from broker.config.settings import Settings
from broker.finance.reports.runs import run_due_reports
from broker.loop.feeds import refresh_prices
from broker.loop.interrupts import apply_notice
from broker.loop.tick import STEPS, tick
from broker.runtime import Runtime, build_runtime
from broker.store.db import make_engine

log = logging.getLogger(__name__)

TASK_KEY = "overspill_task"
SECRET_ARN_ENV = "OVERSPILL_DATABASE_SECRET_ARN"
DB_HOST_ENV = "OVERSPILL_DATABASE_HOST"
DB_PORT_ENV = "OVERSPILL_DATABASE_PORT"
DB_NAME_ENV = "OVERSPILL_DATABASE_NAME"
DB_SSLMODE_ENV = "OVERSPILL_DATABASE_SSLMODE"
# Environment variables this module reads itself (the rest are Settings fields, OVERSPILL_<FIELD>).
OWN_ENV = frozenset({SECRET_ARN_ENV, DB_HOST_ENV, DB_PORT_ENV, DB_NAME_ENV, DB_SSLMODE_ENV})
AWS_PROVIDER = "aws"  # the name providers_config gives the EC2 provider; SQS notices are for its instances

Task = Callable[[Runtime, datetime], dict[str, Any]]
# prices and reports have schedules of their own, so a long price refresh or report never delays a tick
TICK_STEPS = tuple(step for step in STEPS if step[0] not in ("refresh_prices", "run_due_reports"))


class TaskUnavailable(RuntimeError):
    """A scheduled task whose code is not part of this build."""


def _run_tick(rt: Runtime, now: datetime) -> dict[str, Any]:
    report = tick(rt, now, TICK_STEPS)
    return {
        "ok": report.ok,
        "counts": {s.name: s.count for s in report.steps},
        "errors": {s.name: s.error for s in report.steps if s.error},
    }


def _run_refresh_prices(rt: Runtime, now: datetime) -> dict[str, Any]:
    return {"pools": refresh_prices(rt, now, force=True)}


def _run_reports(rt: Runtime, now: datetime) -> dict[str, Any]:
    return {"reports": run_due_reports(rt, now)}


TASKS: dict[str, Task] = {"tick": _run_tick, "refresh_prices": _run_refresh_prices, "reports": _run_reports}
# Scheduled by terraform/ but whose code is not in this build (none today).
PENDING_TASKS: frozenset[str] = frozenset()


# -- database credentials ----------------------------------------------------------------------------------------


def database_url_from_secret(secret: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """A SQLAlchemy URL from a Secrets Manager database secret (the RDS-managed one holds only `username` and
    `password`; RDS rotation-style secrets also hold `host`, `port`, `dbname`) plus the environment for what the
    secret lacks. ValueError naming the missing field."""

    def pick(key: str, env_name: str) -> str:
        value = secret.get(key) or env.get(env_name)
        if value in (None, ""):
            raise ValueError(f"database secret: no {key!r} in the secret and {env_name} is not set")
        return str(value)

    for key in ("username", "password"):
        if not secret.get(key):
            raise ValueError(f"database secret: no {key!r} in the secret")
    port = pick("port", DB_PORT_ENV)
    if not port.isdigit():
        raise ValueError(f"database secret: port {port!r} is not a number")
    url = URL.create(
        "postgresql+psycopg",
        username=str(secret["username"]),
        password=str(secret["password"]),
        host=pick("host", DB_HOST_ENV),
        port=int(port),
        database=pick("dbname", DB_NAME_ENV),
        query={"sslmode": env.get(DB_SSLMODE_ENV) or "require"},
    )
    return url.render_as_string(hide_password=False)


def is_authentication_failure(exc: BaseException) -> bool:
    """Whether a failed PostgreSQL connection attempt was refused for its credentials (SQLSTATE 28P01/28000).

    libpq reports a refused login as a connection failure without a SQLSTATE, so this reads the server's FATAL
    message (PostgreSQL's English text, as RDS and Aurora send it) on a connection that presented a password."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if exc.sqlstate in ("28P01", "28000"):
        return True
    pgconn = exc.pgconn
    return bool(pgconn is not None and pgconn.used_password and "authentication failed" in str(exc))


class SecretCredentials:
    """The database credentials of a Secrets Manager secret, re-read when PostgreSQL refuses them.

    `url()` is the SQLAlchemy URL of the credentials held now; `attach(engine)` makes every new connection of
    `engine` use them and, on an authentication failure, `refresh` once and retry if the secret changed.
    `generation` counts the changes seen (0 at first). Thread-safe: concurrent refused connections read the secret
    once between them."""

    def __init__(self, arn: str, env: Mapping[str, str], *, endpoint_url: str | None) -> None:
        self.arn = arn
        self._env = dict(env)
        self._endpoint_url = endpoint_url
        self._lock = threading.Lock()
        self._url = database_url_from_secret(self._fetch(), self._env)
        self.generation = 0

    def _fetch(self) -> Mapping[str, Any]:
        from broker.config.secrets import fetch_secret_json

        return fetch_secret_json(self.arn, endpoint_url=self._endpoint_url)

    def url(self) -> str:
        with self._lock:
            return self._url

    def refresh(self, refused: str) -> bool:
        """Re-read the secret after PostgreSQL refused the URL `refused`: True when the credentials are now
        different (another thread's refresh counts), False when the secret still holds the refused ones."""
        with self._lock:
            if self._url != refused:
                return True
            fresh = database_url_from_secret(self._fetch(), self._env)
            if fresh == self._url:
                return False
            self._url = fresh
            self.generation += 1
        log.warning("the database refused the cached credentials: re-read secret %s and connecting again", self.arn)
        return True

    def attach(self, engine: Engine) -> None:
        @event.listens_for(engine, "do_connect")
        def _connect(dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> Any:
            url = self.url()
            cparams.update(dialect.create_connect_args(make_url(url))[1])
            try:
                return dialect.connect(*cargs, **cparams)
            except psycopg.OperationalError as exc:
                if not is_authentication_failure(exc) or not self.refresh(url):
                    raise
            cparams.update(dialect.create_connect_args(make_url(self.url()))[1])
            return dialect.connect(*cargs, **cparams)


def _settings_and_credentials(env: Mapping[str, str]) -> tuple[Settings, SecretCredentials | None]:
    settings = Settings(serverless=True)  # no durable local disk here: no directory report destinations
    arn = env.get(SECRET_ARN_ENV, "")
    if not arn or settings.database_url:
        return settings, None
    credentials = SecretCredentials(arn, env, endpoint_url=settings.secrets_endpoint_url or settings.aws_endpoint_url)
    return settings.model_copy(update={"database_url": credentials.url()}), credentials


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings for this container: the environment, with the database URL from the secret when configured."""
    return _settings_and_credentials(os.environ if env is None else env)[0]


# -- per-container state -----------------------------------------------------------------------------------------


@dataclass
class _Container:
    runtime: Runtime
    asgi: Callable[[dict[str, Any], Any], dict[str, Any]]
    credentials: SecretCredentials | None = None
    generation: int = 0  # the credentials' generation the app was built with


_lock = threading.Lock()
_container: _Container | None = None


def _asgi(rt: Runtime) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    from mangum import Mangum
    from mangum.adapter import DEFAULT_TEXT_MIME_TYPES

    from broker.api.problems import PROBLEM_MEDIA_TYPE
    from broker.app import create_app

    # problem details are JSON text: not base64-encoded in the gateway's answer (Mangum knows only application/json)
    return Mangum(
        create_app(runtime=rt), lifespan="off", text_mime_types=[*DEFAULT_TEXT_MIME_TYPES, PROBLEM_MEDIA_TYPE]
    )


def container() -> _Container:
    """The runtime and the Mangum app of this Lambda container, built (and the database migrated) on first use;
    the app is rebuilt with the new URL once the database credentials have changed (see `SecretCredentials`)."""
    global _container
    with _lock:
        if _container is None:
            settings, credentials = _settings_and_credentials(os.environ)
            engine = make_engine(settings)
            if credentials is not None:
                credentials.attach(engine)
            rt = build_runtime(settings, engine=engine)
            generation = credentials.generation if credentials else 0
            _container = _Container(runtime=rt, asgi=_asgi(rt), credentials=credentials, generation=generation)
        elif _container.credentials is not None and _container.credentials.generation != _container.generation:
            rt, credentials = _container.runtime, _container.credentials
            generation = credentials.generation
            rt.settings = rt.settings.model_copy(update={"database_url": credentials.url()})
            _container = _Container(runtime=rt, asgi=_asgi(rt), credentials=credentials, generation=generation)
        return _container


def reset() -> None:
    """Forget the cached runtime (tests; a new container does the same)."""
    global _container
    with _lock:
        if _container is not None:
            _container.runtime.engine.dispose()
        _container = None


# -- dispatch ----------------------------------------------------------------------------------------------------


def handler(event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda handler (see the module docstring)."""
    if not isinstance(event, Mapping):
        raise ValueError(f"unsupported Lambda event: {type(event).__name__}")
    if "requestContext" in event:
        return container().asgi(dict(event), context)
    if TASK_KEY in event:
        return run_task(str(event[TASK_KEY]))
    records = event.get("Records")
    if isinstance(records, list) and records and all(r.get("eventSource") == "aws:sqs" for r in records):
        return handle_sqs(records)
    raise ValueError(f"unsupported Lambda event with keys {sorted(event)[:10]}")


def run_task(name: str) -> dict[str, Any]:
    task = TASKS.get(name)
    if task is None:
        if name in PENDING_TASKS:
            raise TaskUnavailable(f"{TASK_KEY} {name!r} is scheduled but not part of this build")
        raise ValueError(f"{TASK_KEY}: unknown task {name!r} (known: {', '.join(sorted(TASKS))})")
    rt = container().runtime
    result = task(rt, rt.clock())
    log.info("task %s done: %s", name, result)
    return {"task": name, **result}


def handle_sqs(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Act on each record's interruption notice; report the records whose handling failed."""
    from providers.aws import notice_from_message_body

    rt = container().runtime
    failures: list[dict[str, str]] = []
    for record in records:
        message_id = str(record.get("messageId", ""))
        try:
            notice = notice_from_message_body(str(record.get("body", "")), provider=AWS_PROVIDER)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("dropping malformed interruption message %s: %s", message_id, exc)
            continue
        if notice is None:
            continue
        try:
            apply_notice(rt, notice, rt.clock())
        except Exception:  # redeliver this record only; the others are done
            log.exception("handling interruption notice %s (%s) failed", message_id, notice.instance_id)
            failures.append({"itemIdentifier": message_id})
    return {"batchItemFailures": failures}
