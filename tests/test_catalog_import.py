"""SkyPilot-format catalog import (pricing/catalog_import.py): each trap on hand-written fixtures, then every real
vms catalog in ../shared/data/catalog (integration: skipped with a reason when the shared folder is absent)."""

from __future__ import annotations

import gzip
import math
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from federation.placement import PlacementContext, place
from pricing.advisor import Band, SpotAdvisor
from pricing.book import PriceBook
from pricing.catalog_import import MAX_WARNINGS, ImportResult, import_catalog, infer_provider
from pricing.feeds import FeedError
from pricing.risk import RiskEstimate, spot_prior
from providers.accelerators import ACCELERATORS, OTHER_ACCELERATORS, canonical
from providers.model import CapacityType, Offering
from tests.builders import spec
from tests.data import shared_file

NOW = datetime(2026, 4, 2, 12, 0, tzinfo=UTC)
D = Decimal

AWS_HEADER = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone,Arch"
)
GCP_HEADER = (
    "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice"
)
AZURE_HEADER = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,Generation"
MIB_80G = "\"{'Gpus': [{'MemoryInfo': {'SizeInMiB': 81920}}]}\""
MIB_16G = "\"{'Gpus': [{'MemoryInfo': {'SizeInMiB': 16384}}]}\""


def write(tmp_path: Path, name: str, header: str, *rows: str) -> Path:
    path = tmp_path / name
    text = "\n".join([header, *rows]) + "\n"
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def by_key(result: ImportResult) -> dict[str, Offering]:
    return {o.key: o for o in result.offerings}


# -- direct rows (AWS shape) -------------------------------------------------------------------------------------


def aws_file(tmp_path: Path, name: str = "aws_vms.csv") -> Path:
    return write(
        tmp_path,
        name,
        AWS_HEADER,
        "p4d.24xlarge,A100,8.0,96.0,1152.0,21.957642,8.1915,us-east-1,use1-az2,x86_64",  # line 2
        "p3.16xlarge,V100,8.0,64.0,488.0,33.872,,ap-northeast-2,apne2-az3,x86_64",  # 3: no spot
        "p3.16xlarge,V100,8.0,64.0,488.0,33.872,33.872000,ap-northeast-2,apne2-az1,x86_64",  # 4: spot == od
        "p5e.48xlarge,H200,8.0,192.0,2048.0,,19.4254,ap-southeast-3,apse3-az1,x86_64",  # 5: no on-demand
        "m5.large,,,2.0,8.0,0.096,0.04,us-east-1,use1-az1,x86_64",  # 6: CPU only
        "g5.xlarge,nvidia-a10g,1,4,16,1.006,0.4,us-east-1,,x86_64",  # 7: alias, empty zone
    )


def test_direct_rows_prices_zones_and_provenance(tmp_path: Path) -> None:
    result = import_catalog(aws_file(tmp_path), observed_at=NOW)
    offs = by_key(result)
    assert result.provider == "aws" and result.rows == 6 and result.skipped == 2
    od = offs["aws/us-east-1/use1-az2/p4d.24xlarge/on_demand"]
    sp = offs["aws/us-east-1/use1-az2/p4d.24xlarge/spot"]
    assert (od.hourly_usd, sp.hourly_usd) == (D("21.957642"), D("8.1915"))
    assert (od.accelerator, od.accelerator_count, od.gpu_memory_gib, od.vcpus, od.memory_gib) == (
        "A100",
        8,
        40,
        96,
        D("1152.0"),
    )
    assert od.price.source == "catalog:aws_vms.csv" and od.price.observed_at == NOW and not od.price.estimated
    assert od.egress_usd_per_gb == D("0.09") and od.interruption_rate_per_hour == 0.0
    # catalogs carry no interruption data: an AWS spot pool gets the assumed advisor band (10-15%/month)
    assert sp.capacity_type is CapacityType.SPOT and "assumed aws-spot-advisor band 2" in sp.interruption_basis
    assert sp.interruption_rate_per_hour == pytest.approx(-math.log(1 - 0.125) / 720)
    # empty AvailabilityZone: the region is the zone; aliases resolve to canonical names
    a10g = offs["aws/us-east-1/us-east-1/g5.xlarge/on_demand"]
    assert a10g.accelerator == "A10G" and a10g.gpu_memory_gib == 24


def test_missing_spot_gives_no_spot_pool_and_equal_spot_is_kept_without_discount(tmp_path: Path) -> None:
    offs = by_key(import_catalog(aws_file(tmp_path), observed_at=NOW))
    assert "aws/ap-northeast-2/apne2-az3/p3.16xlarge/on_demand" in offs
    assert "aws/ap-northeast-2/apne2-az3/p3.16xlarge/spot" not in offs
    od = offs["aws/ap-northeast-2/apne2-az1/p3.16xlarge/on_demand"]
    sp = offs["aws/ap-northeast-2/apne2-az1/p3.16xlarge/spot"]
    assert sp.hourly_usd == od.hourly_usd == D("33.872")


def test_missing_on_demand_and_cpu_only_rows_are_skipped_with_reasons(tmp_path: Path) -> None:
    result = import_catalog(aws_file(tmp_path), observed_at=NOW)
    assert not [o for o in result.offerings if o.instance_type in ("p5e.48xlarge", "m5.large")]
    assert result.reasons["missing_on_demand"] == 1 and result.reasons["cpu_only"] == 1
    assert result.reasons["no_spot_price"] == 1 and result.reasons["spot_not_cheaper"] == 1
    assert any("line 5: p5e.48xlarge in apse3-az1 has no on-demand price" in w for w in result.warnings)


def test_placeholder_prices_are_not_prices(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "aws_placeholder.csv",
        AWS_HEADER,
        "p3.2xlarge,V100,1,8,61,700.0,700.0,us-east-1,use1-az1,x86_64",
        "p3.8xlarge,V100,4,32,244,12.24,700.0,us-east-1,use1-az1,x86_64",
    )
    result = import_catalog(path, observed_at=NOW)
    assert [o.key for o in result.offerings] == ["aws/us-east-1/use1-az1/p3.8xlarge/on_demand"]
    assert result.reasons["placeholder_price"] == 3 and result.skipped == 1


def test_warnings_are_bounded_but_every_reason_is_counted(tmp_path: Path) -> None:
    rows = [f"p3.2xlarge,V100,1,8,61,,0.9,us-east-1,use1-az{i},x86_64" for i in range(50)]
    result = import_catalog(write(tmp_path, "aws_many.csv", AWS_HEADER, *rows), observed_at=NOW)
    assert result.skipped == 50 and result.reasons == {"missing_on_demand": 50}
    assert len(result.warnings) == MAX_WARNINGS + 1
    assert result.warnings[-1] == "catalog:aws_many.csv missing_on_demand: 50"


# -- Azure: unquoted Generation, no zones, fractional GPUs -------------------------------------------------------


def test_azure_unquoted_generation_is_repaired(tmp_path: Path) -> None:
    rows = (
        "Standard_NC12s_v3,V100,2,12,224,V100,6.12,1.130976,eastus,{gen}",
        "Standard_NC24ads_A100_v4,A100-80GB,1,24,220,A100-80GB,3.673,0.67877,eastus,V2",
        "Standard_NV6ads_A10_v5,A10,0.167,6,55,A10,0.454,0.09,eastus,{gen}",
        "Standard_D2_v5,,,2,8,,0.096,0.02,eastus,{gen}",
    )
    raw = write(tmp_path, "azure_raw.csv", AZURE_HEADER, *(r.format(gen="V1,V2") for r in rows))
    fixed = write(tmp_path, "azure_fixed.csv", AZURE_HEADER, *(r.format(gen='"V1,V2"') for r in rows))
    a, b = import_catalog(raw, observed_at=NOW), import_catalog(fixed, observed_at=NOW)
    assert a.reasons["generation_repaired"] == 3 and "generation_repaired" not in b.reasons
    assert [(o.key, o.hourly_usd) for o in a.offerings] == [(o.key, o.hourly_usd) for o in b.offerings]
    offs = by_key(a)
    v100 = offs["azure/eastus/eastus/Standard_NC12s_v3/spot"]
    assert (v100.hourly_usd, v100.accelerator_count, v100.egress_usd_per_gb) == (D("1.130976"), 2, D("0.087"))
    assert a.reasons["fractional_gpu"] == 1 and a.reasons["cpu_only"] == 1 and a.skipped == 2
    assert len(a.offerings) == 4


def test_surplus_fields_elsewhere_are_malformed(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "azure_bad.csv",
        AZURE_HEADER,
        "Standard_NC6s_v3,V100,1,6,112,V100,3.06,0.6,eastus,V1",
        "Standard_NC6s_v3,V100,1,6,112,V100,3,06,0.6,westus,V1",
    )
    with pytest.raises(FeedError, match=r"catalog:azure_bad\.csv: line 3: 11 fields, the header has 10"):
        import_catalog(path, observed_at=NOW)
    tolerant = import_catalog(path, observed_at=NOW, max_malformed=1)
    assert len(tolerant.offerings) == 2 and tolerant.reasons["malformed"] == 1 and tolerant.skipped == 1


# -- GCP: accelerator rows with an empty InstanceType joined onto hosts -----------------------------------------


def gcp_rows() -> list[str]:
    return [
        "a3-highgpu-8g,208.0,1872.0,,,,us-central1,us-central1-a,9.46006,3.33757",  # 2
        "a2-ultragpu-1g,12.0,170.0,,,,us-central1,us-central1-a,1.09962,0.54978",  # 3: A100-80GB row has no spot
        "g2-standard-24,24.0,96.0,,,,us-central1,us-central1-a,0.88075,0.35242",  # 4: L4 x2
        "a4-highgpu-8g,224.0,3968.0,,,,us-central1,us-central1-b,0.0,0.0",  # 5: host priced 0
        "a3-megagpu-8g,208.0,1872.0,,,,us-central1,us-central1-a,9.46006,3.33757",  # 6: no H100-MEGA row
        "n1-standard-8,8.0,30.0,,,,us-central1,us-central1-a,0.38,0.12059",  # 7
        "n1-highmem-96,96.0,624.0,,,,us-central1,us-central1-a,5.67854,1.7916",  # 8: too big for T4 x1
        "n1-ultramem-40,40.0,961.0,,,,us-central1,us-central1-a,6.3039,1.8",  # 9: memory-optimised, no GPUs
        "n1-highcpu-16,16.0,14.4,,,,us-central1,us-central1-a,0.56679,0.18167",  # 10: highcpu, no GPUs
        "e2-standard-4,4.0,16.0,,,,us-central1,us-central1-a,0.134,0.04",  # 11: CPU only
        f",,,H100,8,{MIB_80G},us-central1,us-central1-a,33.60609,27.652",  # 12
        f",,,A100-80GB,1,{MIB_80G},us-central1,us-central1-a,1.8462,",  # 13
        ",,,L4,2,,us-central1,us-central1-a,1.12008,0.4462",  # 14: memory from the accelerator table
        ",,,B200,8,,us-central1,us-central1-b,64.44,32.6064",  # 15
        f",,,T4,1,{MIB_16G},us-central1,us-central1-a,0.35,0.1579",  # 16
        f",,,T4,4,{MIB_16G},us-central1,us-central1-a,1.4,0.6316",  # 17
        f",,,V100,1,{MIB_16G},us-central1,us-central1-f,2.48,1.0858",  # 18: no host in that zone
        ",,,tpu-v6e-1,1,tpu-v6e-1,us-central1,us-central1-a,700.0,700.0",  # 19
    ]


def test_gcp_host_and_accelerator_rows_are_summed_per_zone(tmp_path: Path) -> None:
    result = import_catalog(write(tmp_path, "gcp_vms.csv", GCP_HEADER, *gcp_rows()), observed_at=NOW)
    offs = by_key(result)
    h100 = "gcp/us-central1/us-central1-a/a3-highgpu-8g"
    assert offs[f"{h100}/on_demand"].hourly_usd == D("9.46006") + D("33.60609")
    assert offs[f"{h100}/spot"].hourly_usd == D("3.33757") + D("27.652")
    assert (offs[f"{h100}/spot"].accelerator, offs[f"{h100}/spot"].accelerator_count) == ("H100", 8)
    assert (offs[f"{h100}/spot"].vcpus, offs[f"{h100}/spot"].gpu_memory_gib) == (208, 80)
    ultra = "gcp/us-central1/us-central1-a/a2-ultragpu-1g"
    assert offs[f"{ultra}/on_demand"].hourly_usd == D("2.94582") and f"{ultra}/spot" not in offs
    l4 = offs["gcp/us-central1/us-central1-a/g2-standard-24/on_demand"]
    assert (l4.accelerator, l4.accelerator_count, l4.gpu_memory_gib, l4.hourly_usd) == ("L4", 2, 24, D("2.00083"))
    b200 = offs["gcp/us-central1/us-central1-b/a4-highgpu-8g/on_demand"]
    assert (b200.accelerator, b200.hourly_usd, b200.egress_usd_per_gb) == ("B200", D("64.44"), D("0.12"))


def test_gcp_n1_hosts_take_attachable_gpus_in_sensible_combos(tmp_path: Path) -> None:
    offs = by_key(import_catalog(write(tmp_path, "gcp_vms.csv", GCP_HEADER, *gcp_rows()), observed_at=NOW))
    n1 = sorted(o.instance_type for o in offs.values() if o.instance_type.startswith("n1-"))
    # n1-standard-8 has too few vCPUs for 4 T4s (4 per GPU), n1-highmem-96 too many for 1 T4 (GCP's max 48),
    # n1-highcpu and n1-ultramem hosts take none
    assert sorted(set(n1)) == ["n1-highmem-96+T4x4", "n1-standard-8+T4x1"]
    t4 = offs["gcp/us-central1/us-central1-a/n1-standard-8+T4x1/spot"]
    assert (t4.hourly_usd, t4.vcpus, t4.memory_gib, t4.accelerator_count) == (D("0.27849"), 8, D("30.0"), 1)


def test_gcp_unmatched_rows_are_skipped_with_warnings(tmp_path: Path) -> None:
    result = import_catalog(write(tmp_path, "gcp_vms.csv", GCP_HEADER, *gcp_rows()), observed_at=NOW)
    assert result.rows == 18
    assert result.reasons["no_accelerator_in_zone"] == 1 and result.reasons["accelerator_without_host"] == 1
    assert result.reasons["tpu"] == 1 and result.reasons["cpu_only"] == 3  # n1-ultramem, n1-highcpu, e2
    assert result.skipped == 6
    assert any("line 6: a3-megagpu-8g needs H100-MEGA x8" in w for w in result.warnings)
    assert any("line 18: V100 x1 in us-central1-f has no host there" in w for w in result.warnings)


def test_gz_file_gives_the_same_offerings(tmp_path: Path) -> None:
    plain = import_catalog(write(tmp_path, "gcp_vms.csv", GCP_HEADER, *gcp_rows()), observed_at=NOW)
    packed = import_catalog(write(tmp_path, "gcp_vms.csv.gz", GCP_HEADER, *gcp_rows()), observed_at=NOW)
    assert [(o.key, o.hourly_usd) for o in packed.offerings] == [(o.key, o.hourly_usd) for o in plain.offerings]
    assert packed.offerings[0].price.source == "catalog:gcp_vms.csv.gz"


def test_imported_offerings_feed_the_price_book_and_placement(tmp_path: Path) -> None:
    result = import_catalog(write(tmp_path, "gcp_vms.csv", GCP_HEADER, *gcp_rows()), observed_at=NOW)
    book = PriceBook.build(result.offerings, NOW)
    job = spec(accelerators=("T4",), gpu_count=1, max_total_usd=D("100"), work_gpu_hours=D("10"))
    best = place(job, book, PlacementContext(now=NOW, remaining_work_hours=D("10")))
    assert best is not None and best.offering.key == "gcp/us-central1/us-central1-a/n1-standard-8+T4x1/spot"


# -- bad files and provider inference ---------------------------------------------------------------------------


def test_bad_files_raise_feed_error_naming_file_and_line(tmp_path: Path) -> None:
    no_price = write(tmp_path, "aws_a.csv", "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Region")
    with pytest.raises(FeedError, match=r"catalog:aws_a\.csv: line 1: missing column\(s\) Price"):
        import_catalog(no_price, observed_at=NOW)
    bad_number = write(
        tmp_path,
        "aws_b.csv",
        AWS_HEADER,
        "p3.2xlarge,V100,1,8,61,3.06,0.9,us-east-1,use1-az1,x86_64",
        "p3.2xlarge,V100,1,8,61,abc,0.9,us-east-1,use1-az2,x86_64",
    )
    with pytest.raises(FeedError, match=r"catalog:aws_b\.csv: line 3: Price 'abc' is not a number"):
        import_catalog(bad_number, observed_at=NOW)
    empty = tmp_path / "aws_c.csv"
    empty.write_text("")
    with pytest.raises(FeedError, match=r"catalog:aws_c\.csv: line 1: empty file"):
        import_catalog(empty, observed_at=NOW)


def test_truncated_gzip_and_missing_file_raise_feed_error(tmp_path: Path) -> None:
    rows = [f"p3.2xlarge,V100,1,8,61,3.06,0.9,us-east-1,use1-az{i},x86_64" for i in range(5000)]
    whole = write(tmp_path, "aws_whole.csv.gz", AWS_HEADER, *rows).read_bytes()
    cut = tmp_path / "aws_cut.csv.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(FeedError, match=r"catalog:aws_cut\.csv\.gz: near line \d+: unreadable \(EOFError"):
        import_catalog(cut, observed_at=NOW)
    with pytest.raises(FeedError, match=r"catalog:aws_gone\.csv: unreadable \(FileNotFoundError"):
        import_catalog(tmp_path / "aws_gone.csv", observed_at=NOW)


def test_provider_comes_from_the_file_name_or_folder_or_argument(tmp_path: Path) -> None:
    assert infer_provider(Path("catalog/gcp_vms_skypilot_bootstrap_2026-04-02.csv.gz")) == "gcp"
    assert infer_provider(Path("catalogs/v8/lambda/vms.csv")) == "lambda"
    assert infer_provider(Path("skypilot_v8_aws_vms_pfamily_gpu_subset.csv")) == "aws"
    assert infer_provider(Path("aws_vs_gcp.csv")) is None
    assert infer_provider(Path("vms.csv")) is None
    path = write(tmp_path, "vms.csv", AWS_HEADER, "p3.2xlarge,V100,1,8,61,3.06,0.9,us-east-1,use1-az1,x86_64")
    with pytest.raises(FeedError, match=r"catalog:vms\.csv: cannot tell the provider"):
        import_catalog(path, observed_at=NOW)
    result = import_catalog(path, provider="OCI", observed_at=NOW)
    assert result.provider == "oci" and result.offerings[0].egress_usd_per_gb == D("0.09")


# -- the real catalogs ------------------------------------------------------------------------------------------

REAL = {
    # file: (rows, skipped, offerings)
    "skypilot_v8_aws_vms_pfamily_gpu_subset.csv": (223, 9, 392),
    "gcp_vms_skypilot_2026-04-02_gpu_and_hosts.csv": (3738, 1720, 5140),
    "gcp_vms_skypilot_bootstrap_2026-04-02.csv.gz": (30510, 28492, 5140),
    "azure_vms_anycloud_2026-04-02_gpu.csv": (892, 114, 1536),
    "azure_vms_anycloud_first_2026-04-02.csv.gz": (60436, 59658, 1536),
    "lambda_vms_skypilot_bootstrap_2026-04-02.csv": (272, 17, 255),
}


def real(name: str) -> ImportResult:
    return import_catalog(shared_file(f"catalog/{name}"), observed_at=NOW)


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_catalog_imports_clean(name: str) -> None:
    result = real(name)
    assert (result.rows, result.skipped, len(result.offerings)) == REAL[name]
    assert result.provider == name.split("_")[2 if name.startswith("skypilot") else 0]
    assert len({o.key for o in result.offerings}) == len(result.offerings)
    keys = {o.key for o in result.offerings}
    for o in result.offerings:
        assert canonical(o.accelerator) == o.accelerator
        assert o.accelerator in ACCELERATORS or o.accelerator in OTHER_ACCELERATORS, o.accelerator
        assert o.gpu_memory_gib > 0 and o.accelerator_count >= 1 and o.vcpus > 0
        assert isinstance(o.hourly_usd, Decimal) and o.hourly_usd > 0 and o.hourly_usd != D("700")
        assert o.price.source == f"catalog:{name}" and o.price.observed_at == NOW and not o.price.estimated
        if o.capacity_type is CapacityType.SPOT:  # every spot pool has its on-demand twin
            assert o.key.removesuffix("/spot") + "/on_demand" in keys


@pytest.mark.integration
def test_real_gcp_a3_highgpu_8g_is_host_plus_h100_row() -> None:
    for name in ("gcp_vms_skypilot_2026-04-02_gpu_and_hosts.csv", "gcp_vms_skypilot_bootstrap_2026-04-02.csv.gz"):
        offs = by_key(real(name))
        base = "gcp/us-central1/us-central1-a/a3-highgpu-8g"
        assert offs[f"{base}/on_demand"].hourly_usd == D("9.46006") + D("33.60609")
        assert offs[f"{base}/spot"].hourly_usd == D("3.33757") + D("27.652")
        b200 = offs["gcp/us-central1/us-central1-b/a4-highgpu-8g/on_demand"]
        assert (b200.accelerator, b200.gpu_memory_gib, b200.hourly_usd) == ("B200", 180, D("90.216"))
        t4 = offs["gcp/us-central1/us-central1-a/n1-standard-8+T4x1/on_demand"]
        assert (t4.hourly_usd, t4.vcpus, t4.gpu_memory_gib) == (D("0.38") + D("0.35"), 8, 16)
    gpu, whole = (
        real("gcp_vms_skypilot_2026-04-02_gpu_and_hosts.csv"),
        real("gcp_vms_skypilot_bootstrap_2026-04-02.csv.gz"),
    )
    assert {(o.key, o.hourly_usd) for o in gpu.offerings} == {(o.key, o.hourly_usd) for o in whole.offerings}
    assert whole.reasons["tpu"] == 1648 and whole.reasons["accelerator_without_host"] == 31


@pytest.mark.integration
def test_real_aws_p4d_rows() -> None:
    result = real("skypilot_v8_aws_vms_pfamily_gpu_subset.csv")
    offs = by_key(result)
    p4d = [o for o in result.offerings if o.instance_type == "p4d.24xlarge"]
    assert Counter(o.capacity_type for o in p4d) == {CapacityType.ON_DEMAND: 29, CapacityType.SPOT: 29}
    assert {(o.accelerator, o.accelerator_count, o.gpu_memory_gib, o.vcpus) for o in p4d} == {("A100", 8, 40, 96)}
    assert offs["aws/us-east-1/use1-az1/p4d.24xlarge/on_demand"].hourly_usd == D("21.957642")
    assert offs["aws/us-east-1/use1-az1/p4d.24xlarge/spot"].hourly_usd == D("2.465500")
    # spot == on-demand is kept as listed, not turned into a discount
    assert offs["aws/ap-northeast-1/apne1-az1/p4d.24xlarge/spot"].hourly_usd == D("30.097800")
    assert not [o for o in result.offerings if o.instance_type == "p5e.48xlarge"]  # no on-demand price
    assert result.reasons["missing_on_demand"] == 9 and result.reasons["spot_not_cheaper"] == 30
    assert offs["aws/us-west-2/usw2-az2/p6-b300.48xlarge/on_demand"].gpu_memory_gib == 288


@pytest.mark.integration
def test_real_azure_raw_and_repaired_files_agree() -> None:
    raw = real("azure_vms_anycloud_first_2026-04-02.csv.gz")
    fixed = real("azure_vms_anycloud_2026-04-02_gpu.csv")
    assert raw.reasons["generation_repaired"] == 29856 and "generation_repaired" not in fixed.reasons
    assert [(o.key, o.hourly_usd, o.gpu_memory_gib) for o in raw.offerings] == [
        (o.key, o.hourly_usd, o.gpu_memory_gib) for o in fixed.offerings
    ]
    offs = by_key(raw)
    v100 = offs["azure/eastus/eastus/Standard_NC12s_v3/spot"]  # an unquoted V1,V2 row in the raw file
    assert (v100.hourly_usd, v100.accelerator_count, v100.vcpus) == (D("1.130976"), 2, 12)
    h100 = offs["azure/eastus/eastus/Standard_ND96isr_H100_v5/on_demand"]
    assert (h100.hourly_usd, h100.accelerator_count, h100.egress_usd_per_gb) == (D("98.32"), 8, D("0.087"))
    assert raw.reasons["fractional_gpu"] == 114 and all(o.zone == o.region for o in raw.offerings)


@pytest.mark.integration
def test_real_lambda_has_no_spot_and_reads_gpu_memory_from_gpu_info() -> None:
    result = real("lambda_vms_skypilot_bootstrap_2026-04-02.csv")
    assert {o.capacity_type for o in result.offerings} == {CapacityType.ON_DEMAND}
    offs = by_key(result)
    gh200 = offs["lambda/europe-central-1/europe-central-1/gpu_1x_gh200/on_demand"]
    assert (gh200.gpu_memory_gib, gh200.hourly_usd, gh200.egress_usd_per_gb) == (96, D("1.99"), D("0"))
    h100 = offs["lambda/europe-central-1/europe-central-1/gpu_8x_h100_sxm5/on_demand"]
    assert (h100.accelerator_count, h100.gpu_memory_gib, h100.hourly_usd) == (8, 80, D("27.52"))


def test_spot_pools_get_the_advisor_band_when_one_is_given(tmp_path: Path) -> None:
    """With Spot Advisor data the band of the pool's region and type is its prior; types it does not list keep
    the assumed band; on-demand pools stay at 0."""
    advisor = SpotAdvisor({("us-east-1", "Linux", "p4d.24xlarge"): Band.of(0)}, as_of="2026-04-01")
    offs = by_key(import_catalog(aws_file(tmp_path), observed_at=NOW, advisor=advisor))
    sp = offs["aws/us-east-1/use1-az2/p4d.24xlarge/spot"]
    assert sp.interruption_rate_per_hour == pytest.approx(Band.of(0).rate_per_hour)
    assert "aws-spot-advisor band 0 (<5%/month)" in sp.interruption_basis and "assumed" not in sp.interruption_basis
    other = offs["aws/ap-northeast-2/apne2-az1/p3.16xlarge/spot"]
    assert other.interruption_rate_per_hour == pytest.approx(Band.of(2).rate_per_hour)
    assert offs["aws/us-east-1/use1-az2/p4d.24xlarge/on_demand"].interruption_rate_per_hour == 0.0


def test_gcp_and_azure_spot_priors_are_their_documented_defaults() -> None:
    assert spot_prior("gcp", "us-central1", "a2-highgpu-1g") == RiskEstimate(0.05, "gcp default (no public rate)")
    assert spot_prior("azure", "eastus", "Standard_NC24ads_A100_v4").rate_per_hour == 0.05
    assert spot_prior("lambda", "us-east-1", "gpu_1x_a100").basis.startswith("default spot prior")
