"""A local stand-in for the two Google APIs the GCP price feed reads, for tests through the real SDK clients.

Role: serve real-shaped JSON on 127.0.0.1 so `google.cloud.billing_v1.CloudCatalogClient` and
`google.cloud.compute_v1.{MachineTypes,AcceleratorTypes}Client` (transport="rest", `api_endpoint` =
`GcpFake.endpoint`, `AnonymousCredentials`) run unmodified against it.

Contract:
- `GET /v1/services/{service}/skus` answers `{"skus": [...], "nextPageToken": "..."}` pages of at most `pageSize`
  SKUs (the real API's default and maximum is 5000); `pageToken` is the opaque token of the previous page.
- `GET /compute/v1/projects/{project}/aggregated/machineTypes` and `.../aggregated/acceleratorTypes` answer the
  aggregated-list shape of the real API (the libcloud gce fixtures): `items` keyed `zones/{zone}` holding
  `{"machineTypes": [...]}` / `{"acceleratorTypes": [...]}`, a zone with nothing on the page holding the real
  `NO_RESULTS_ON_PAGE` warning, int64 fields as JSON strings; at most `maxResults` resources a page.
- `fail_next(count, status, after=0)` makes `count` requests (after `after` normal ones) answer the Google error body
  `{"error": {"code": ..., "message": ..., "status": ...}}` with that HTTP status.
- Every request path (with its query) is appended to `requests`, so tests can see paging happen.

The SKUs in `default_skus()` copy the real catalogue's shapes: the Network egress SKU verbatim from the cyclenerd
example, and for compute the real description grammar ("A2 Instance Core running in Americas", "Spot Preemptible
A3 Instance Ram running in Americas", "Nvidia H100 80GB GPU attached to Spot Preemptible VMs running in
Americas" with the real SKU ids and prices of the us-central1 a3-highgpu-8g spot fixture). Other prices are
plausible, not Google's.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.local_server import QuietHTTPServer

COMPUTE_SERVICE_ID = "6F81-5844-456A"
AMERICAS = ("us-central1", "us-east1", "us-east4", "us-west1")
EMEA = ("europe-west1", "europe-west4")
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def money(usd: str) -> dict[str, Any]:
    """A `google.type.Money` JSON value (int64 `units` as a string, like the real API) for a decimal string."""
    value = Decimal(usd).quantize(Decimal("1e-9"))
    units = int(value)
    nanos = int((value - units) * 1_000_000_000)
    return {"currencyCode": "USD", "units": str(units), "nanos": nanos}


def sku(
    sku_id: str,
    description: str,
    *,
    group: str,
    usage: str,
    regions: Iterable[str],
    unit: str,
    usd: str,
    family: str = "Compute",
) -> dict[str, Any]:
    """One SKU in the real `services.skus.list` shape (one pricing info, one tier starting at 0)."""
    unit_description = {"h": "hour", "GiBy.h": "gibibyte hour", "GiBy": "gibibyte"}[unit]
    base_unit, base_description, factor = {
        "h": ("s", "second", 3600),
        "GiBy.h": ("By.s", "byte second", 3865470566400),
        "GiBy": ("By", "byte", 1073741824),
    }[unit]
    return {
        "name": f"services/{COMPUTE_SERVICE_ID}/skus/{sku_id}",
        "skuId": sku_id,
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": family,
            "resourceGroup": group,
            "usageType": usage,
        },
        "serviceRegions": list(regions),
        "pricingInfo": [
            {
                "summary": "",
                "pricingExpression": {
                    "usageUnit": unit,
                    "usageUnitDescription": unit_description,
                    "baseUnit": base_unit,
                    "baseUnitDescription": base_description,
                    "baseUnitConversionFactor": factor,
                    "displayQuantity": 1,
                    "tieredRates": [{"startUsageAmount": 0, "unitPrice": money(usd)}],
                },
                "aggregationInfo": {
                    "aggregationLevel": "ACCOUNT",
                    "aggregationInterval": "DAILY",
                    "aggregationCount": 1,
                },
                "currencyConversionRate": 1,
                "effectiveTime": "2025-10-22T19:53:14.655269Z",
            }
        ],
        "serviceProviderName": "Google",
    }


# The real second entry of cyclenerd_skus_example_with_template.json (not a compute SKU: the feed must skip it).
REAL_EGRESS_SKU: dict[str, Any] = {
    "name": "services/6F81-5844-456A/skus/02EE-77CE-ACCD",
    "skuId": "02EE-77CE-ACCD",
    "description": "Network Vpn Internet Egress from Americas to Africa",
    "category": {
        "serviceDisplayName": "Compute Engine",
        "resourceFamily": "Network",
        "resourceGroup": "VPNInternetEgress",
        "usageType": "OnDemand",
    },
    "serviceRegions": ["us-central1", "us-east1", "us-west1"],
    "pricingInfo": [
        {
            "summary": "",
            "pricingExpression": {
                "usageUnit": "GiBy",
                "usageUnitDescription": "gibibyte",
                "baseUnit": "By",
                "baseUnitDescription": "byte",
                "baseUnitConversionFactor": 1073741824,
                "displayQuantity": 1,
                "tieredRates": [
                    {"startUsageAmount": 0, "unitPrice": {"currencyCode": "USD", "units": "0", "nanos": 120000000}},
                    {"startUsageAmount": 1024, "unitPrice": {"currencyCode": "USD", "units": "0", "nanos": 110000000}},
                    {"startUsageAmount": 10240, "unitPrice": {"currencyCode": "USD", "units": "0", "nanos": 80000000}},
                ],
            },
            "aggregationInfo": {"aggregationLevel": "ACCOUNT", "aggregationInterval": "MONTHLY", "aggregationCount": 1},
            "currencyConversionRate": 1,
            "effectiveTime": "2021-11-26T10:50:40.206Z",
        }
    ],
    "serviceProviderName": "Google",
}

# Prices the default catalogue serves (USD per hour, or per GiB-hour for RAM); tests sum these.
PRICES: dict[str, str] = {
    "A2_CORE": "0.031611",
    "A2_RAM": "0.004237",
    "A100": "2.933908",
    "A2_CORE_SPOT": "0.012644",
    "A2_RAM_SPOT": "0.001695",
    "A100_SPOT": "1.173563",
    "A3_CORE": "0.029563",
    "A3_RAM": "0.002579",
    "H100": "9.796550",
    "A3_CORE_SPOT": "0.00586",  # real: EEE5-1DA5-D9CF (us-central1 a3-highgpu-8g spot fixture)
    "A3_RAM_SPOT": "0.000511",  # real: F619-87C3-D3BA
    "H100_SPOT": "2.253",  # real: 7A6D-F74C-B0A3
    "G2_CORE": "0.024988",
    "G2_RAM": "0.002928",
    "L4": "0.5599",
    "G2_CORE_SPOT": "0.009995",
    "G2_RAM_SPOT": "0.001171",
    "L4_SPOT": "0.22396",
    "N1_CORE": "0.031611",
    "N1_RAM": "0.004237",
    "N1_CORE_SPOT": "0.006655",
    "N1_RAM_SPOT": "0.000892",
    "T4": "0.35",
    "T4_SPOT": "0.14",
    "V100": "2.48",
    "A2_CORE_EMEA": "0.034802",
    "A2_RAM_EMEA": "0.004664",
    "A100_EMEA": "3.226999",
}


def default_skus() -> list[dict[str, Any]]:
    """The catalogue the tests serve: A2/A3/G2/N1 core and RAM, A100/H100/L4/T4/V100 GPUs, plus SKUs to skip.

    Deliberate gaps: no spot V100 anywhere (so n1 + V100 spot pools are skipped with a warning) and no spot SKUs
    at all in EMEA (europe-west4 has on-demand A2 only).
    """
    p = PRICES
    od, pre = "OnDemand", "Preemptible"
    return [
        REAL_EGRESS_SKU,
        sku("A2C0-0000-0001", "A2 Instance Core running in Americas", group="CPU", usage=od, regions=AMERICAS,
            unit="h", usd=p["A2_CORE"]),
        sku("A2R0-0000-0002", "A2 Instance Ram running in Americas", group="RAM", usage=od, regions=AMERICAS,
            unit="GiBy.h", usd=p["A2_RAM"]),
        sku("A100-0000-0003", "Nvidia Tesla A100 GPU running in Americas", group="GPU", usage=od, regions=AMERICAS,
            unit="h", usd=p["A100"]),
        sku("A2C0-0000-0004", "Spot Preemptible A2 Instance Core running in Americas", group="CPU", usage=pre,
            regions=AMERICAS, unit="h", usd=p["A2_CORE_SPOT"]),
        sku("A2R0-0000-0005", "Spot Preemptible A2 Instance Ram running in Americas", group="RAM", usage=pre,
            regions=AMERICAS, unit="GiBy.h", usd=p["A2_RAM_SPOT"]),
        sku("A100-0000-0006", "Nvidia Tesla A100 GPU attached to Spot Preemptible VMs running in Americas",
            group="GPU", usage=pre, regions=AMERICAS, unit="h", usd=p["A100_SPOT"]),
        sku("A3C0-0000-0007", "A3 Instance Core running in Americas", group="CPU", usage=od, regions=AMERICAS,
            unit="h", usd=p["A3_CORE"]),
        sku("A3R0-0000-0008", "A3 Instance Ram running in Americas", group="RAM", usage=od, regions=AMERICAS,
            unit="GiBy.h", usd=p["A3_RAM"]),
        sku("H100-0000-0009", "Nvidia H100 80GB GPU running in Americas", group="GPU", usage=od, regions=AMERICAS,
            unit="h", usd=p["H100"]),
        sku("EEE5-1DA5-D9CF", "Spot Preemptible A3 Instance Core running in Americas", group="CPU", usage=pre,
            regions=AMERICAS, unit="h", usd=p["A3_CORE_SPOT"]),
        sku("F619-87C3-D3BA", "Spot Preemptible A3 Instance Ram running in Americas", group="RAM", usage=pre,
            regions=AMERICAS, unit="GiBy.h", usd=p["A3_RAM_SPOT"]),
        sku("7A6D-F74C-B0A3", "Nvidia H100 80GB GPU attached to Spot Preemptible VMs running in Americas",
            group="GPU", usage=pre, regions=AMERICAS, unit="h", usd=p["H100_SPOT"]),
        sku("G2C0-0000-0010", "G2 Instance Core running in Americas", group="CPU", usage=od, regions=AMERICAS,
            unit="h", usd=p["G2_CORE"]),
        sku("G2R0-0000-0011", "G2 Instance Ram running in Americas", group="RAM", usage=od, regions=AMERICAS,
            unit="GiBy.h", usd=p["G2_RAM"]),
        sku("L400-0000-0012", "Nvidia L4 GPU running in Americas", group="GPU", usage=od, regions=AMERICAS,
            unit="h", usd=p["L4"]),
        sku("G2C0-0000-0013", "Spot Preemptible G2 Instance Core running in Americas", group="CPU", usage=pre,
            regions=AMERICAS, unit="h", usd=p["G2_CORE_SPOT"]),
        sku("G2R0-0000-0014", "Spot Preemptible G2 Instance Ram running in Americas", group="RAM", usage=pre,
            regions=AMERICAS, unit="GiBy.h", usd=p["G2_RAM_SPOT"]),
        sku("L400-0000-0015", "Nvidia L4 GPU attached to Spot Preemptible VMs running in Americas", group="GPU",
            usage=pre, regions=AMERICAS, unit="h", usd=p["L4_SPOT"]),
        sku("N1C0-0000-0016", "N1 Predefined Instance Core running in Americas", group="N1Standard", usage=od,
            regions=AMERICAS, unit="h", usd=p["N1_CORE"]),
        sku("N1R0-0000-0017", "N1 Predefined Instance Ram running in Americas", group="N1Standard", usage=od,
            regions=AMERICAS, unit="GiBy.h", usd=p["N1_RAM"]),
        sku("N1C0-0000-0018", "Spot Preemptible N1 Predefined Instance Core running in Americas", group="N1Standard",
            usage=pre, regions=AMERICAS, unit="h", usd=p["N1_CORE_SPOT"]),
        sku("N1R0-0000-0019", "Spot Preemptible N1 Predefined Instance Ram running in Americas", group="N1Standard",
            usage=pre, regions=AMERICAS, unit="GiBy.h", usd=p["N1_RAM_SPOT"]),
        sku("T400-0000-0020", "Nvidia Tesla T4 GPU running in Americas", group="GPU", usage=od, regions=AMERICAS,
            unit="h", usd=p["T4"]),
        sku("T400-0000-0021", "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas",
            group="GPU", usage=pre, regions=AMERICAS, unit="h", usd=p["T4_SPOT"]),
        sku("V100-0000-0022", "Nvidia Tesla V100 GPU running in Americas", group="GPU", usage=od, regions=AMERICAS,
            unit="h", usd=p["V100"]),
        sku("A2C0-0000-0023", "A2 Instance Core running in EMEA", group="CPU", usage=od, regions=EMEA, unit="h",
            usd=p["A2_CORE_EMEA"]),
        sku("A2R0-0000-0024", "A2 Instance Ram running in EMEA", group="RAM", usage=od, regions=EMEA,
            unit="GiBy.h", usd=p["A2_RAM_EMEA"]),
        sku("A100-0000-0025", "Nvidia Tesla A100 GPU running in EMEA", group="GPU", usage=od, regions=EMEA,
            unit="h", usd=p["A100_EMEA"]),
        # Look-alikes the feed must not take for VM prices.
        sku("C0MM-0000-0026", "Commitment v1: A2 Cpu in Americas for 1 Year", group="CPU", usage="Commit1Yr",
            regions=AMERICAS, unit="h", usd="0.019915"),
        sku("VWS0-0000-0027", "Nvidia Tesla T4 Virtual Workstation GPU running in Americas", group="GPU", usage=od,
            regions=AMERICAS, unit="h", usd="0.55"),
        sku("CUST-0000-0028", "Custom Instance Core running in Americas", group="CPU", usage=od, regions=AMERICAS,
            unit="h", usd="0.033174"),
        sku("PD00-0000-0029", "Storage PD Capacity", group="PDStandard", usage=od, regions=AMERICAS,
            unit="GiBy", usd="0.04", family="Storage"),
    ]  # fmt: skip


def machine_type(zone: str, name: str, cpus: int, memory_mb: int, gpu: tuple[str, int] | None = None) -> dict[str, Any]:
    """One compute#machineType as the aggregated list returns it (int64 `id` as a string)."""
    out: dict[str, Any] = {
        "kind": "compute#machineType",
        "id": str(zlib.crc32(f"{zone}/{name}".encode()) * 1_000_003),
        "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
        "name": name,
        "description": f"{cpus} vCPUs, {memory_mb / 1024:g} GB RAM",
        "guestCpus": cpus,
        "memoryMb": memory_mb,
        "imageSpaceGb": 0,
        "maximumPersistentDisks": 128,
        "maximumPersistentDisksSizeGb": "263168",
        "zone": zone,
        "selfLink": f"https://www.googleapis.com/compute/v1/projects/proj/zones/{zone}/machineTypes/{name}",
        "isSharedCpu": False,
    }
    if gpu is not None:
        out["accelerators"] = [{"guestAcceleratorType": gpu[0], "guestAcceleratorCount": gpu[1]}]
    return out


def accelerator_type(zone: str, name: str, description: str, max_cards: int) -> dict[str, Any]:
    """One compute#acceleratorType as the aggregated list returns it (the libcloud k80 fixture's shape)."""
    return {
        "kind": "compute#acceleratorType",
        "id": str(zlib.crc32(f"{zone}/{name}".encode())),
        "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
        "name": name,
        "description": description,
        "zone": f"https://www.googleapis.com/compute/v1/projects/proj/zones/{zone}",
        "selfLink": f"https://www.googleapis.com/compute/v1/projects/proj/zones/{zone}/acceleratorTypes/{name}",
        "maximumCardsPerInstance": max_cards,
    }


def default_machine_types() -> dict[str, list[dict[str, Any]]]:
    """Real shapes (vCPUs, memoryMb, bundled GPUs) of the GPU machine types, per zone, plus non-GPU noise."""
    z1, z2, eu = "us-central1-a", "us-central1-b", "europe-west4-a"
    return {
        z1: [
            machine_type(z1, "e2-standard-2", 2, 8192),
            machine_type(z1, "a2-highgpu-1g", 12, 87040, ("nvidia-tesla-a100", 1)),
            machine_type(z1, "a2-highgpu-2g", 24, 174080, ("nvidia-tesla-a100", 2)),
            machine_type(z1, "a3-highgpu-8g", 208, 1916928, ("nvidia-h100-80gb", 8)),
            machine_type(z1, "g2-standard-4", 4, 16384, ("nvidia-l4", 1)),
            machine_type(z1, "n1-standard-1", 1, 3840),
            machine_type(z1, "n1-standard-4", 4, 15360),
            machine_type(z1, "n1-standard-8", 8, 30720),
            machine_type(z1, "n1-standard-16", 16, 61440),
        ],
        z2: [
            machine_type(z2, "g2-standard-4", 4, 16384, ("nvidia-l4", 1)),
            machine_type(z2, "n1-standard-8", 8, 30720),
        ],
        eu: [
            machine_type(eu, "a2-highgpu-1g", 12, 87040, ("nvidia-tesla-a100", 1)),
            machine_type(eu, "n1-standard-4", 4, 15360),
        ],
    }


def default_accelerator_types() -> dict[str, list[dict[str, Any]]]:
    z1, z2, eu = "us-central1-a", "us-central1-b", "europe-west4-a"
    return {
        z1: [
            accelerator_type(z1, "nvidia-tesla-a100", "NVIDIA A100 40GB", 16),
            accelerator_type(z1, "nvidia-h100-80gb", "NVIDIA H100 80GB", 8),
            accelerator_type(z1, "nvidia-l4", "NVIDIA L4", 8),
            accelerator_type(z1, "nvidia-tesla-t4", "NVIDIA T4", 4),
            accelerator_type(z1, "nvidia-tesla-v100", "NVIDIA V100", 8),
        ],
        z2: [
            accelerator_type(z2, "nvidia-l4", "NVIDIA L4", 8),
            accelerator_type(z2, "nvidia-tesla-t4", "NVIDIA T4", 4),
        ],
        eu: [accelerator_type(eu, "nvidia-tesla-a100", "NVIDIA A100 40GB", 16)],
        "us-west1-a": [],  # answers the real NO_RESULTS_ON_PAGE warning
    }


@dataclass
class GcpFake:
    """The fake server. Use as a context manager; `endpoint` is what `ClientOptions(api_endpoint=...)` takes."""

    skus: list[dict[str, Any]] = field(default_factory=default_skus)
    machine_types: dict[str, list[dict[str, Any]]] = field(default_factory=default_machine_types)
    accelerator_types: dict[str, list[dict[str, Any]]] = field(default_factory=default_accelerator_types)
    project: str = "proj"
    service_id: str = COMPUTE_SERVICE_ID
    requests: list[str] = field(default_factory=list)
    _failures: list[int] = field(default_factory=list)  # 0 = answer normally
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: QuietHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail_next(self, count: int, status: int, after: int = 0) -> None:
        """Answer `count` requests with a Google error of HTTP `status` (403, 429, 503...), starting once `after`
        more requests have been answered normally (so a later page can fail)."""
        with self._lock:
            self._failures.extend([0] * after + [status] * count)

    def start(self) -> GcpFake:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake._handle(self)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

        self._server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="gcp-fake", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> GcpFake:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- request handling ------------------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self._lock:
            self.requests.append(handler.path)
            failure = self._failures.pop(0) if self._failures else None
        if failure:
            self._send(handler, failure, _error(failure, f"injected failure {failure} for {url.path}"))
            return
        skus_path = f"/v1/services/{self.service_id}/skus"
        compute_prefix = f"/compute/v1/projects/{self.project}/aggregated/"
        if url.path == skus_path:
            self._send(handler, 200, self._skus_page(query))
        elif url.path == compute_prefix + "machineTypes":
            self._send(handler, 200, self._aggregated(query, "machineTypes", self.machine_types))
        elif url.path == compute_prefix + "acceleratorTypes":
            self._send(handler, 200, self._aggregated(query, "acceleratorTypes", self.accelerator_types))
        elif url.path.startswith("/v1/services/") and url.path.endswith("/skus"):
            self._send(handler, 404, _error(404, f"Service {url.path.split('/')[3]} not found."))
        else:
            self._send(handler, 404, _error(404, f"no route for {url.path}"))

    def _skus_page(self, query: dict[str, str]) -> dict[str, Any]:
        size = min(int(query.get("pageSize") or 5000), 5000)
        start = int(query.get("pageToken") or 0)
        page = self.skus[start : start + size]
        body: dict[str, Any] = {"skus": page, "nextPageToken": ""}
        if start + size < len(self.skus):
            body["nextPageToken"] = str(start + size)
        return body

    def _aggregated(
        self, query: dict[str, str], kind: str, per_zone: dict[str, list[dict[str, Any]]]
    ) -> dict[str, Any]:
        size = min(int(query.get("maxResults") or 500), 500)
        start = int(query.get("pageToken") or 0)
        flat = [(zone, item) for zone, items in per_zone.items() for item in items]
        page = flat[start : start + size]
        items: dict[str, Any] = {}
        for zone in per_zone:
            on_page = [item for z, item in page if z == zone]
            if on_page:
                items[f"zones/{zone}"] = {kind: on_page}
            else:
                items[f"zones/{zone}"] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": "There are no results for scope 'zones/" + zone + "' on this page.",
                        "data": [{"key": "scope", "value": f"zones/{zone}"}],
                    }
                }
        body: dict[str, Any] = {
            "kind": f"compute#{kind[:-1]}AggregatedList",
            "id": f"projects/{self.project}/aggregated/{kind}",
            "items": items,
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{self.project}/aggregated/{kind}",
        }
        if start + size < len(flat):
            body["nextPageToken"] = str(start + size)
        return body

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json; charset=UTF-8")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


def _error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": _STATUS_NAMES.get(status, "UNKNOWN")}}
