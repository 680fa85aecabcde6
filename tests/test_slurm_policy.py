"""Slurm burst governance (`broker.slurm.policy`), dependency rewriting (`providers.slurm.dependency`) and the
provider's release priority semantics, without a cluster (pure functions and a recording runner)."""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from broker.config.settings import Settings
from broker.slurm.accounts import SlurmAccountPolicy, image_allowed
from broker.slurm.policy import BurstRequest, Refusal, SlurmRequest, burst_request
from federation.pressure import QueueModel
from providers.slurm.dependency import rewrite_as_succeeded
from providers.slurm.provider import PartitionInfo, SlurmProvider

ACCOUNTS = {
    "acme": SlurmAccountPolicy(
        tenant="acme", team="nlp", project="atlas", burst=True, max_job_usd=Decimal("100"),
        allowed_images=["registry.site/acme/*", "ghcr.io/x/train:1"], users=["alice"], qos=["normal"],
        allowed_providers=["aws", "gcp"],
    ),
    "beta": SlurmAccountPolicy(tenant="beta", burst=False),
}  # fmt: skip


def request(comment: str, **kw: Any) -> SlurmRequest:
    fields: dict[str, Any] = {
        "target": "12",
        "name": "train",
        "user": "alice",
        "account": "acme",
        "qos": "normal",
        "partition": "gpu",
        "accelerator": "A100",
        "gpus": 2,
        "time_limit_minutes": 90,
        "comment": comment,
    }
    return SlurmRequest(**{**fields, **kw})


def judge(spec: dict[str, Any] | None = None, **kw: Any) -> BurstRequest | Refusal:
    comment = "overspill-burst" + (f" {json.dumps(spec)}" if spec is not None else "")
    return burst_request(request(comment, **kw), ACCOUNTS, {"gpu": "registry.site/runner:1"}, ["aws", "gcp", "azure"])


def test_the_account_mapping_decides_who_pays_and_the_comment_only_narrows() -> None:
    allowed = judge({"max_total_usd": "40", "image": "registry.site/acme/bert:2", "allowed_providers": ["aws"]})
    assert isinstance(allowed, BurstRequest)
    c = allowed.create
    assert (allowed.policy.tenant, c.team, c.project) == ("acme", "nlp", "atlas")
    assert (c.max_total_usd, c.image, c.allowed_providers) == (Decimal("40"), "registry.site/acme/bert:2", ["aws"])
    assert (c.accelerators, c.gpu_count, c.runtime_hours, c.checkpoint_uri) == (["A100"], 2, Decimal("1.5"), None)
    default = judge()
    assert isinstance(default, BurstRequest)
    assert default.create.max_total_usd == Decimal("100")  # no ceiling asked: the policy's
    assert default.create.image == "registry.site/runner:1"  # no image asked: the partition's default
    assert default.create.allowed_providers == ["aws", "gcp"]  # the policy's clouds, not every cloud


@pytest.mark.parametrize(
    ("spec", "kw", "reason", "words"),
    [
        ({"max_total_usd": "100.01"}, {}, "ceiling_above_policy", "above the account's max_job_usd 100"),
        ({"image": "docker.io/evil/miner:1"}, {}, "image_not_allowed", "not in the account's allowed_images"),
        ({"image": "registry.site/acme/../other/x:1"}, {}, "image_not_allowed", "allowed_images"),
        ({"checkpoint_uri": "s3://b/tenants/other/"}, {}, "comment_field_not_allowed", "the broker derives it"),
        ({"team": "finance"}, {}, "comment_field_not_allowed", "team"),
        ({"gpu_count": 8}, {}, "comment_field_not_allowed", "gpu_count"),
        ({"allowed_providers": ["azure"]}, {}, "provider_not_allowed", "beyond"),
        ({"max_total_usd": "NaN"}, {}, "unusable_spec", "max_total_usd"),
        ({}, {"account": "beta"}, "account_not_allowed", "does not allow bursting"),
        ({}, {"account": "gamma"}, "account_not_mapped", "not in OVERSPILL_SLURM_ACCOUNTS"),
        ({}, {"user": "mallory"}, "user_not_allowed", "mallory"),
        ({}, {"qos": "high"}, "qos_not_allowed", "QOS high"),
        ({}, {"partition": "cpu"}, "image_not_allowed", "no image given"),
    ],
)
def test_refusals_name_the_reason(spec: dict[str, Any], kw: dict[str, Any], reason: str, words: str) -> None:
    verdict = judge(spec, **kw)
    assert isinstance(verdict, Refusal) and verdict.reason == reason and words in verdict.message


def test_a_default_entry_covers_unlisted_accounts() -> None:
    accounts = {"*": SlurmAccountPolicy(tenant="shared", burst=True, max_job_usd=Decimal("10"))}
    verdict = burst_request(request("overspill-burst", account="any"), accounts, {"gpu": "img:1"}, ["aws"])
    assert isinstance(verdict, BurstRequest) and verdict.policy.tenant == "shared"


def test_the_hold_mark_in_the_comment_does_not_spoil_the_opt_in() -> None:
    marked = 'overspill-burst {"max_total_usd": "5"} [overspill-hold broker=b at=2026-01-01T00:00:00Z reason=x]'
    verdict = burst_request(request(marked), ACCOUNTS, {"gpu": "registry.site/runner:1"}, ["aws"])
    assert isinstance(verdict, BurstRequest) and verdict.create.max_total_usd == Decimal("5")


def test_bad_account_policies_stop_the_settings_naming_the_entry() -> None:
    cases = [
        ({"acme": {"tenant": "Acme Corp", "burst": False}}, "slurm_accounts.acme.tenant"),
        ({"acme": {"tenant": "acme", "burst": True}}, "needs max_job_usd"),
        ({"acme": {"tenant": "acme", "allowed_images": ["reg/*/x"]}}, "slurm_accounts.acme.allowed_images"),
        ({"acme": {"tenant": "acme", "ceiling": "5"}}, "slurm_accounts.acme.ceiling"),
    ]
    for accounts, words in cases:
        with pytest.raises(ValidationError) as exc:
            Settings(slurm_accounts=accounts)
        assert words in str(exc.value)


def test_image_prefixes() -> None:
    allowed = ["registry.site/acme/*", "ghcr.io/x/train:*"]
    assert image_allowed("registry.site/acme/a/b:1", allowed) and image_allowed("ghcr.io/x/train:2", allowed)
    assert not image_allowed("registry.site/acme", allowed) and not image_allowed("ghcr.io/x/trainer:1", allowed)
    assert not image_allowed("registry.site/acme/../evil:1", allowed)


@pytest.mark.parametrize(
    ("before", "target", "others", "after"),
    [
        ("afterok:12(unfulfilled)", "12", [], ""),
        ("afterok:12(unfulfilled),afterany:13(unfulfilled)", "12", [], "afterany:13"),
        ("afternotok:12(unfulfilled)", "12", [], "afterok:12"),
        ("after:12+5(unfulfilled)?afterok:13(unfulfilled)", "12", [], ""),
        ("afterok:12_3(unfulfilled)", "12_3", [], ""),
        ("afterok:12_*(unfulfilled)", "12_3", ["12_0", "12_1"], "afterok:12_0,afterok:12_1"),
        ("afterany:12(unfulfilled)", "12_3", ["12_0"], "afterany:12_0"),
        ("afternotok:12_*(unfulfilled)", "12_3", [], "afterok:12_3"),
        ("aftercorr:12(unfulfilled)", "12_3", ["12_0"], None),
        ("singleton(unfulfilled)", "12", [], None),
        ("afterok:99(unfulfilled)", "12", [], None),
    ],
)
def test_dependencies_rewritten_as_if_the_job_had_completed(
    before: str, target: str, others: list[str], after: str | None
) -> None:
    assert rewrite_as_succeeded(before, target, others) == after


def test_afternotok_is_converted_only_once_before_the_cancel() -> None:
    assert rewrite_as_succeeded("afterok:12(failed),afternotok:12(unfulfilled)", "12", convert_notok=False) == (
        "afternotok:12"
    )


class Recorder:
    """A runner answering squeue with one held job and `scontrol show config` with a priority plugin."""

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if argv[0] == "squeue":
            held = {
                "job_id": 7, "name": "x", "job_state": "PENDING", "state_reason": "JobHeldAdmin", "partition": "gpu",
                "user_name": "alice", "tres_per_node": "gres:gpu:a100:1", "priority": 0, "comment": "overspill-burst",
            }  # fmt: skip
            return subprocess.CompletedProcess(argv, 0, json.dumps({"jobs": [held]}), "")
        if argv[:3] == ["scontrol", "show", "config"]:
            return subprocess.CompletedProcess(argv, 0, f"PriorityType            = {self.plugin}\n", "")
        return subprocess.CompletedProcess(argv, 0, "", "")


@pytest.mark.parametrize(("plugin", "pinned"), [("priority/basic", True), ("priority/multifactor", False)])
def test_release_restores_the_queue_place_without_pinning_an_ageing_priority(plugin: str, pinned: bool) -> None:
    run = Recorder(plugin)
    provider = SlurmProvider(
        broker_id="b", partitions={"gpu": PartitionInfo("A100", Decimal("1"), 4)}, queue_model=QueueModel, run=run
    )
    provider.release("7", priority=4294901757, owned=True)
    updates = [c for c in run.calls if c[:2] == ["scontrol", "update"]]
    assert ["scontrol", "release", "7"] in run.calls
    assert (["scontrol", "update", "JobId=7", "Priority=4294901757"] in updates) is pinned
