"""The tick steps' bulkhead (broker.services.bulkhead): one bad item is logged, counted, recorded and skipped; one that
fails `tick_item_quarantine_after` ticks in a row is quarantined, and one that succeeds again is forgotten. On
SQLite and PostgreSQL (the failure counts live in `tick_item_failure`)."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import Session, select

from broker.runtime import Runtime
from broker.services.bulkhead import bulkhead
from broker.store.tables import TickItemFailure
from tests.conftest import MovableClock


def _rows(rt: Runtime) -> dict[str, TickItemFailure]:
    with Session(rt.engine) as s:
        return {r.item: r for r in s.exec(select(TickItemFailure).where(TickItemFailure.step == "demo")).all()}


def test_a_failing_item_is_skipped_counted_recorded_and_quarantined(rt: Runtime, clock: MovableClock) -> None:
    limit = rt.settings.tick_item_quarantine_after
    records: list[tuple[str, bool]] = []
    done: list[str] = []
    for n in range(limit + 1):
        with bulkhead(rt, "demo", clock()) as bh:
            for key in ("bad", "good", "flaky"):
                if bh.skip(key):
                    continue
                with bh.item(key, lambda exc, q: records.append((str(exc), q))):
                    if key == "bad" or (key == "flaky" and n == 0):
                        raise ValueError(f"poison in {key}")
                    done.append(f"{key}{n}")
        clock.advance(minutes=10)
    # the good item ran every tick, the flaky one recovered, the bad one ran `limit` times and then was left alone
    assert done.count("good0") == 1 and len([d for d in done if d.startswith("good")]) == limit + 1
    assert [d for d in done if d.startswith("flaky")] == [f"flaky{n}" for n in range(1, limit + 1)]
    rows = _rows(rt)
    assert set(rows) == {"bad"}, "the flaky item's row went once it succeeded again"
    assert rows["bad"].failures == limit and rows["bad"].quarantined_at is not None
    assert "ValueError: poison in bad" in rows["bad"].last_error
    assert records.count(("poison in bad", False)) == limit - 1 and records.count(("poison in bad", True)) == 1
    exposition = rt.metrics.exposition().decode()
    assert f'overspill_tick_item_errors_total{{step="demo"}} {float(limit + 1)}' in exposition
    assert 'overspill_tick_items_quarantined_total{step="demo"} 1.0' in exposition


def test_an_expected_exception_passes_through_uncounted(rt: Runtime, clock: MovableClock) -> None:
    class Expected(Exception):
        pass

    caught = False
    with bulkhead(rt, "demo", clock()) as bh:
        try:
            with bh.item("x", passes=(Expected,)):
                raise Expected("the step handles this one itself")
        except Expected:
            caught = True
    assert caught and _rows(rt) == {}
    assert 'overspill_tick_item_errors_total{step="demo"}' not in rt.metrics.exposition().decode()


def test_a_failing_record_does_not_undo_the_bulkhead(rt: Runtime, clock: MovableClock) -> None:
    def broken(exc: BaseException, quarantined: bool) -> None:
        raise RuntimeError("recording failed too")

    with bulkhead(rt, "demo", clock() + timedelta(seconds=1)) as bh:
        with bh.item("x", broken):
            raise KeyError("x")
        with bh.item("y"):
            pass
    assert _rows(rt)["x"].failures == 1
