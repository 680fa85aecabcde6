"""`broker.loop.place.BookMemo`: the usable book and pool histories a step computes once per job shape per tick
are exactly what it would compute per job, and an entry never serves another book."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from broker.loop.place import BookMemo, without_blocked
from federation.placement import PlacementContext
from pricing.book import PriceBook
from providers.model import JobSpec
from tests.builders import offering

NOW = datetime(2026, 11, 2, tzinfo=UTC)


def _spec(*accelerators: str) -> JobSpec:
    return JobSpec(
        tenant="t",
        team="a",
        project="p",
        name="j",
        image="i",
        command=(),
        accelerators=accelerators,
        gpu_count=8,
        max_total_usd=Decimal(100),
        runtime_hours=Decimal(2),
    )


def _book(price: str = "10") -> PriceBook:
    return PriceBook.build(
        [
            offering(zone="us-east-1a", price=price),
            offering(zone="us-east-1b", price="9"),
            offering(zone="us-east-1a", capacity="on_demand", price="30"),
            offering(provider="gcp", region="us-central1", zone="us-central1-a", price="8"),
            offering(accelerator="H100", instance_type="p5.48xlarge", zone="us-east-1a", price="40", gpu_memory=80),
        ],
        NOW,
    )


def test_the_memo_answers_what_each_job_would_compute_for_every_shape_and_exclusion() -> None:
    memo, book = BookMemo(), _book()
    contexts = [
        PlacementContext(now=NOW, remaining_work_hours=Decimal(2)),
        PlacementContext(now=NOW, remaining_work_hours=Decimal(2), blocklist=frozenset({"aws/us-east-1/us-east-1b"})),
        PlacementContext(now=NOW, remaining_work_hours=Decimal(2), launchable=frozenset({"aws"})),
        PlacementContext(now=NOW, remaining_work_hours=Decimal(2), no_checkpoint_store=frozenset({"gcp"})),
    ]
    for spec in (_spec("A100"), _spec("H100"), _spec("A100", "H100")):
        for ctx in contexts * 2:  # the second round comes from the memo
            got = memo.without_blocked(book, spec, ctx, NOW)
            assert sorted(o.key for o in got) == sorted(o.key for o in without_blocked(book, spec, ctx, NOW))


def test_an_entry_never_serves_another_book_and_histories_are_read_once_per_pool_set() -> None:
    memo = BookMemo()
    ctx = PlacementContext(now=NOW, remaining_work_hours=Decimal(2), blocklist=frozenset({"gcp"}))
    first, second = _book("10"), _book("5")  # the same pools, another price
    assert {o.price.hourly_usd for o in memo.without_blocked(first, _spec("A100"), ctx, NOW)} == {
        Decimal(10),
        Decimal(9),
        Decimal(30),
    }
    assert Decimal(5) in {o.price.hourly_usd for o in memo.without_blocked(second, _spec("A100"), ctx, NOW)}
    reads: list[frozenset[str]] = []

    def read(keys: frozenset[str]) -> dict[str, object]:
        reads.append(keys)
        return {}

    for book in (first, second, first):
        memo.outlook(book, _spec("A100"), read)  # type: ignore[arg-type]
    memo.outlook(first, _spec("H100"), read)  # type: ignore[arg-type]
    assert len(reads) == 2 and all(all(k.endswith("/spot") for k in keys) for keys in reads)
