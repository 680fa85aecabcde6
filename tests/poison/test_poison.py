"""Poison at every ingestion point, for ONE tenant or ONE item: the other tenant never notices.

Each case of `POINTS` feeds one poison value (deep nesting, huge sizes, NaN and infinity, dates at the calendar's
ends, wrong types, unicode and NUL, truncated bodies) through one ingestion point, for acme's job or one pool, on
every tick of the script in `tests/poison/world.py`; beta's outcome (its jobs' states after every tick, their event
kinds, its ledger to the cent) must equal the clean run's, tick for tick, on SQLite and on PostgreSQL, and no tick
step may have stopped.

The registry is structural, as `tests/attacks/test_location_inputs.py` is for locations: every ingestion point the
product declares (every `source=` given to the bounded loader `agent.bounded.load_json`, found by an AST walk of the
source tree, and the points of `DECLARED` below, which read through an SDK's own parser) must have poison cases in
`POINTS` or be listed in `UNCOVERED` with why, or this test fails.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agent import protocol as proto
from broker.api.auth import callback_token
from providers.base import Instance, InstanceState, InterruptionNotice
from providers.model import CapacityType, Offering, Price
from tests.poison.world import Outcome, Poison, World, make_world, run

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("agent", "providers", "pricing", "federation", "broker")

# --- poison values -----------------------------------------------------------------------------------------------

DEEP = b"[" * 30_000
HUGE = b" " * 70_000 + b"{}"
FAR = ("9999-12-31T23:59:59+00:00", "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+00:00")
TEXT = "\x00\ud800\u202e\x1b[31mé" * 50


def _seq(n: int) -> int:
    return 1_000 + n  # acme's reports: a seq per tick, never one beta's names use


def _entry(body: Callable[[World, int], bytes], kind: str = "progress") -> Poison:
    """A mailbox entry in acme's own mailbox, named for acme's placement, holding `body`."""

    def poison(w: World, n: int) -> None:
        pid = w.placement("A1").id
        w.put_entry("acme", f"{pid}-{_seq(n):020d}-{kind}.json", body(w, n))

    return poison


def _signed(fields: Callable[[World, int], dict[str, Any]], kind: str = "progress") -> Poison:
    """A report acme's agent signed with the placement's genuine key, holding hostile values."""

    def body(w: World, n: int) -> bytes:
        return w.signed_raw("A1", {"seq": _seq(n), "kind": kind, "at": w.clock().isoformat(), **fields(w, n)})

    return _entry(body, kind)


def _notice(deadline: str) -> Poison:
    return _signed(
        lambda w, n: {
            "notice": {"source": "aws", "kind": "preempt", "received_at": w.clock().isoformat(), "deadline": deadline}
        },
        kind="notice",
    )


def _callback(body: Callable[[World, int], bytes]) -> Poison:
    """The same bodies through `POST /v1/placements/{id}/reports`: never a 5xx."""

    def poison(w: World, n: int) -> None:
        pid = w.placement("A1").id
        answer = w.api.post(
            f"/v1/placements/{pid}/reports", content=body(w, n), headers={"Content-Type": "application/json"}
        )
        assert answer.status_code < 500, (answer.status_code, answer.text[:300])

    return poison


Body = Callable[[World, int], bytes]


def _signed_body(fields: Callable[[World, int], dict[str, Any]], kind: str = "progress") -> Body:
    return lambda w, n: w.signed_raw("A1", {"seq": _seq(n), "kind": kind, "at": w.clock().isoformat(), **fields(w, n)})


def _notice_body(deadline: str) -> Callable[[World, int], bytes]:
    return _signed_body(
        lambda w, n: {
            "notice": {"source": "aws", "kind": "preempt", "received_at": w.clock().isoformat(), "deadline": deadline}
        },
        kind="notice",
    )


def _describe(change: Callable[[Instance], Instance]) -> Poison:
    """What the cloud answers about acme's instance (its describe answer), from tick 1 on."""

    def poison(w: World, n: int) -> None:
        iid = w.placement("A1").instance_id
        assert iid is not None
        w.cloud.answers[iid] = change

    return poison


def _raise(exc: BaseException) -> Callable[[Instance], Instance]:
    def change(_: Instance) -> Instance:
        raise exc

    return change


def _cloud_notice(deadline: datetime | None, at: datetime | None = None) -> Poison:
    """An interruption notice for acme's instance, as the cloud's notice feed (EventBridge, metadata) brings it."""

    def poison(w: World, n: int) -> None:
        iid = w.placement("A1").instance_id
        assert iid is not None
        w.cloud.notices.append(InterruptionNotice(iid, "cloud", "interruption", at or w.clock(), deadline))

    return poison


def _offering(price: Callable[[World], Price] | None = None, **change: Any) -> Poison:
    """One more pool in the cloud's price feed answer, with a hostile field (the other pools as before)."""

    def poison(w: World, n: int) -> None:
        honest = Offering(
            provider="cloud",
            region="r1",
            zone="z9",
            instance_type="gpu.1",
            accelerator="A100",
            accelerator_count=1,
            gpu_memory_gib=40,
            vcpus=8,
            memory_gib=Decimal("64"),
            capacity_type=CapacityType.SPOT,
            price=Price(Decimal("10"), "scripted", w.clock()),
        )
        offered = replace(honest, **change)
        if price is not None:
            offered = replace(offered, price=price(w))
        w.cloud.poisoned_offerings[:] = [offered]

    return poison


def _nan_instance(i: Instance) -> Instance:
    return replace(i, checkpointed_work_hours=Decimal("NaN"))


# --- the registry ---------------------------------------------------------------------------------------------------

POINTS: dict[str, dict[str, Poison]] = {
    "mailbox_entry": {
        "deep_nesting_unsigned": _entry(lambda w, n: DEEP),
        "huge": _entry(lambda w, n: HUGE),
        "truncated": _entry(lambda w, n: w.signed_raw("A1", {"seq": _seq(n), "kind": "progress", "at": "x"})[:40]),
        "not_utf8": _entry(lambda w, n: b'{"seq": "\xff\xfe"}'),
        "wrong_types": _signed(lambda w, n: {"checkpointed": [1], "progress": "done"}),
        "nan_checkpoint": _signed(lambda w, n: {"checkpointed": float("nan")}),
        "inf_progress": _signed(lambda w, n: {"progress": {"done": 1e400, "total": 1}}),
        "huge_integer": _signed(lambda w, n: {"exit_code": 10**30, "outcome": "succeeded"}, kind="final"),
        "unicode_nul_final": _signed(
            lambda w, n: {"outcome": "user_failed", "exit_code": 1, "detail": TEXT, "log_tail": TEXT}, kind="final"
        ),
    },
    "agent_report_callback": {
        "deep_nesting": _callback(lambda w, n: DEEP),
        "huge": _callback(lambda w, n: HUGE),
        "truncated": _callback(lambda w, n: b'{"placement_id": "x", "seq'),
        "nan": _callback(_signed_body(lambda w, n: {"checkpointed": float("nan")})),
        "notice_year_10000_utc": _callback(_notice_body(FAR[1])),
        "notice_9999": _callback(_notice_body(FAR[0])),
        "unicode_nul": _callback(_signed_body(lambda w, n: {"detail": TEXT}, kind="started")),
    },
    "agent_notice": {
        "deadline_9999_12_31": _notice(FAR[0]),
        "deadline_year_10000_utc": _notice(FAR[1]),
        "deadline_year_1": _notice(FAR[2]),
        "deadline_wrong_type": _notice("tomorrow"),
    },
    "cloud_describe": {
        "raises_unexpected": _describe(_raise(KeyError("InstanceStatuses"))),
        "raises_recursion": _describe(_raise(RecursionError("maximum recursion depth exceeded"))),
        "nan_checkpoint": _describe(_nan_instance),
        "started_at_year_1": _describe(lambda i: replace(i, started_at=datetime(1, 1, 1, tzinfo=UTC))),
        "ended_at_9999": _describe(
            lambda i: replace(i, state=InstanceState.SUCCEEDED, ended_at=datetime(9999, 12, 31, 23, 59, tzinfo=UTC))
        ),
    },
    "cloud_notice": {
        "deadline_9999": _cloud_notice(datetime(9999, 12, 31, 23, 59, tzinfo=UTC)),
        "deadline_year_1": _cloud_notice(datetime(1, 1, 1, tzinfo=UTC)),
        "received_year_1": _cloud_notice(None, datetime(1, 1, 1, tzinfo=UTC)),
    },
    "price_feed": {
        "nan_price": _offering(price=lambda w: Price(Decimal("NaN"), "scripted", w.clock())),
        "infinite_price": _offering(price=lambda w: Price(Decimal("Infinity"), "scripted", w.clock())),
        "negative_price": _offering(price=lambda w: Price(Decimal("-10"), "scripted", w.clock())),
        "huge_price": _offering(price=lambda w: Price(Decimal("1e30"), "scripted", w.clock())),
        "observed_9999": _offering(
            price=lambda w: Price(Decimal("10"), "scripted", datetime(9999, 12, 31, 23, 59, tzinfo=UTC))
        ),
        "nan_interruption_rate": _offering(interruption_rate_per_hour=float("nan")),
        "nul_instance_type": _offering(instance_type="gpu\x00.1"),
    },
}

# ingestion points read through an SDK's or a library's own parser (no `load_json` call of ours to find), declared
# here so the registry covers them
DECLARED = {"mailbox_entry", "agent_report_callback", "agent_notice", "cloud_describe", "cloud_notice", "price_feed"}

# ingestion points that exist and have no poison case here yet, with why (kept short and honest)
UNCOVERED = {
    "slurm_json": "squeue/sacct/slurmrestd JSON: needs the real Slurm cluster (tests/slurm_cluster.py); parsed "
    "through load_json since this change",
    "cloud_list": "the orphan sweep's list answers: no case yet",
    "catalog_file": "operator-supplied catalog files: no case yet",
    "bill_file": "bill imports: tests/attacks/test_finance_bill_bombs.py covers size bombs; no tenant isolation case",
    "webhook_response": "report delivery webhooks: tests/attacks/test_finance_slow_webhooks.py; no case here yet",
    "log_chunk": "log chunks are served, not parsed; no case here yet",
}


def load_json_sources() -> set[str]:
    """Every `source=` literal given to `load_json` in the product's source tree (an f-string's literal head)."""
    found: set[str] = set()
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                name = getattr(node, "func", None)
                if not isinstance(node, ast.Call) or getattr(name, "id", getattr(name, "attr", "")) != "load_json":
                    continue
                for kw in node.keywords:
                    if kw.arg == "source" and isinstance(kw.value, ast.Constant):
                        found.add(str(kw.value.value))
                    elif kw.arg == "source" and isinstance(kw.value, ast.JoinedStr):
                        head = kw.value.values[0]
                        found.add(str(head.value) if isinstance(head, ast.Constant) else "<dynamic>")
    return found


# which registry point stands for each `load_json` source
SOURCE_POINTS = {"report": "mailbox_entry"}


def test_every_ingestion_point_has_poison_cases_or_says_why_not() -> None:
    sources = load_json_sources()
    assert sources, "the AST walk found no load_json call: the walk is broken"
    unregistered = sorted(s for s in sources if SOURCE_POINTS.get(s, s) not in POINTS and s not in UNCOVERED)
    assert not unregistered, f"ingestion points without poison cases (add them to POINTS): {unregistered}"
    assert set(POINTS) >= DECLARED, sorted(DECLARED - set(POINTS))
    assert all(POINTS[p] for p in POINTS), "a point with no cases"


def test_signed_poisons_carry_the_genuine_signature(clean_world: World) -> None:
    """A signed poison is refused for its values, never for its signature: the same body with benign values is a
    report its placement signed."""
    raw = clean_world.signed_raw("A1", {"seq": 7, "kind": "progress", "at": "2026-11-02T08:00:00+00:00"})
    report = proto.Report.from_json(raw)
    assert report.verify(callback_token(clean_world.rt.settings, report.placement_id))
    notice = _notice_body("2026-11-02T08:02:00+00:00")(clean_world, 1)
    report = proto.Report.from_json(notice)
    assert report.verify(callback_token(clean_world.rt.settings, report.placement_id))


CASES = [pytest.param(point, case, id=f"{point}-{case}") for point, cases in POINTS.items() for case in cases]


@pytest.fixture(scope="module")
def clean_world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """The script played without poison (SQLite; beta's outcome does not depend on the database)."""
    world = make_world("sqlite://", tmp_path_factory.mktemp("clean"))
    world.outcome = run(world, None)
    return world


@pytest.fixture(scope="module")
def clean(clean_world: World) -> Outcome:
    return clean_world.outcome


def test_the_clean_run_completes_cancels_and_charges_beta(clean: Outcome) -> None:
    assert clean.states[-1] == ("succeeded", "cancelled")
    assert clean.ledger and all(Decimal(usd) >= 0 for _, _, usd in clean.ledger)
    assert not clean.failed_steps


@pytest.mark.parametrize(("point", "case"), CASES)
def test_poison_for_one_tenant_leaves_the_other_as_it_was(
    point: str, case: str, clean: Outcome, db_url: str, tmp_path: Path
) -> None:
    world = make_world(db_url, tmp_path)
    try:
        poisoned = run(world, POINTS[point][case])
    finally:
        world.rt.engine.dispose()
    assert poisoned.states == clean.states, "beta's jobs went another way, or took other ticks"
    assert poisoned.ledger == clean.ledger and poisoned.spent == clean.spent, "beta was charged otherwise"
    assert poisoned.events == clean.events
    assert not poisoned.failed_steps, f"a step stopped: {poisoned.failed_steps}"
