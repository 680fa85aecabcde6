"""A local stand-in for two Azure endpoints the Azure price feed uses, for end-to-end tests with real clients.

- Retail Prices API: `GET /api/retail/prices?api-version=...&$filter=...&$skip=N`. The filter is parsed the way
  Azure applies it since 2023-01-01-preview: `field eq 'value'` clauses joined by `and`, field names
  case-insensitive, VALUES case-sensitive (`armRegionName eq 'EastUS'` matches nothing), `priceType` matching the
  item's `type`. Anything else in `$filter` is a 400. Pages of `page_size` items carry `NextPageLink` (absolute, with
  `$skip`) until the last, which has `NextPageLink: null`. Items have the real field set.
- ARM: `GET /subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/vmSizes?api-version=...` answering
  `{"value": [{name, numberOfCores, osDiskSizeInMB, resourceDiskSizeInMB, memoryInMB, maxDataDiskCount}]}`;
  a Bearer token is required (401 otherwise), location matching is case-insensitive as in ARM.
- Fault injection per endpoint (`fail`: a status, optional Retry-After, optionally on one prices page only) and a
  response delay (`delay`) for timeouts. Every request is recorded in `requests`.

The handler disables Nagle's algorithm, or every keep-alive call would cost ~40 ms.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from tests.local_server import QuietHTTPServer

PRICES_PATH = "/api/retail/prices"
VM_SERVICE_ID = "DZH313Z7MMC8"
_VMSIZES = re.compile(r"^/subscriptions/([^/]+)/providers/Microsoft\.Compute/locations/([^/]+)/vmSizes$", re.I)
_CLAUSE = re.compile(r"\s*([A-Za-z]+)\s+eq\s+'((?:[^']|'')*)'\s*")


def retail_item(
    arm_sku: str,
    meter_name: str,
    product_name: str,
    retail_price: str,
    *,
    region: tuple[str, str] = ("eastus", "US East"),
    price_type: str = "Consumption",
    service_name: str = "Virtual Machines",
    unit: str = "1 Hour",
    currency: str = "USD",
    primary: bool = True,
    effective: str = "2024-07-01T00:00:00Z",
    reservation_term: str | None = None,
) -> dict[str, Any]:
    """One Retail Prices item in the real shape. `region` is (armRegionName, location); `retail_price` is JSON
    number text, kept verbatim on the wire."""
    arm_region, location = region
    product_id = "DZH318Z" + _digest(product_name)[:5].upper()
    item: dict[str, Any] = {
        "currencyCode": currency,
        "tierMinimumUnits": RawNumber("0.0"),
        "retailPrice": RawNumber(retail_price),
        "unitPrice": RawNumber(retail_price),
        "armRegionName": arm_region,
        "location": location,
        "effectiveStartDate": effective,
        "meterId": str(
            uuid.uuid5(uuid.NAMESPACE_URL, "|".join((arm_sku, meter_name, product_name, arm_region, price_type)))
        ),
        "meterName": meter_name,
        "productId": product_id,
        "skuId": f"{product_id}/{_digest(meter_name)[:4].upper()}",
        "productName": product_name,
        "skuName": meter_name,
        "serviceName": service_name,
        "serviceId": VM_SERVICE_ID if service_name == "Virtual Machines" else "DZH317F1HKN0",
        "serviceFamily": "Compute" if service_name == "Virtual Machines" else "Storage",
        "unitOfMeasure": unit,
        "type": price_type,
        "isPrimaryMeterRegion": primary,
        "armSkuName": arm_sku,
    }
    if reservation_term:
        item["reservationTerm"] = reservation_term
    return item


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class RawNumber(str):
    """A JSON number kept as its exact text (so tests control the digits the feed parses)."""


def _dumps(value: Any) -> str:
    """JSON text where `RawNumber` values are written as bare numbers."""
    if isinstance(value, RawNumber):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_dumps(v) for v in value) + "]"
    return json.dumps(value)


def _a100(size: str, meter: str, od: str, spot: str, r: tuple[str, str]) -> list[dict[str, Any]]:
    linux = "Virtual Machines NCads A100 v4 Series"
    windows = linux + " Windows"
    return [
        retail_item(size, meter, linux, od, region=r),
        retail_item(size, f"{meter} Spot", linux, spot, region=r),
        retail_item(size, f"{meter} Low Priority", linux, "0.7346", region=r),
        retail_item(size, meter, windows, "4.409", region=r),
        retail_item(size, f"{meter} Spot", windows, "1.4146", region=r),
        retail_item(size, meter, windows, od, price_type="DevTestConsumption", region=r),
        retail_item(size, meter, linux, "25742.4", price_type="Reservation", reservation_term="1 Year", region=r),
    ]


def default_items() -> list[dict[str, Any]]:
    """Realistic rows for eastus and westus2 (prices as in the 2026-04 Azure catalog), with every kind of row the
    feed must drop: Windows, Low Priority, DevTestConsumption, Reservation, non-GPU, fractional GPU, another
    service, a non-hourly unit and a non-primary duplicate meter."""
    east = ("eastus", "US East")
    west = ("westus2", "US West 2")
    t4 = "Virtual Machines NCasT4_v3 Series"
    nd = "Virtual Machines NDasr A100 v4 Series"
    dv3 = "Virtual Machines Dsv3 Series"
    nva10 = "Virtual Machines NVadsA10 v5 Series"
    ndv2 = "Virtual Machines NDv2 Series"
    return [
        *_a100("Standard_NC24ads_A100_v4", "NC24ads A100 v4", "3.673", "0.67877", east),
        retail_item("Standard_ND96asr_v4", "ND96asr A100 v4", nd, "27.197", region=east),
        retail_item("Standard_ND96asr_v4", "ND96asr A100 v4 Spot", nd, "5.98334", region=east),
        retail_item("Standard_ND96asr_v4", "ND96asr A100 v4", nd + " Windows", "31.613", region=east),
        retail_item("Standard_NC4as_T4_v3", "NC4as T4 v3", t4, "0.526", region=east),
        retail_item("Standard_NC4as_T4_v3", "NC4as T4 v3 Spot", t4, "0.194515", region=east),
        # The same meter billed from a non-primary meter region: the primary one must win.
        retail_item("Standard_NC4as_T4_v3", "NC4as T4 v3", t4, "0.5786", primary=False, region=east),
        retail_item("Standard_D2s_v3", "D2s v3", dv3, "0.096", region=east),
        retail_item("Standard_D2s_v3", "D2s v3 Spot", dv3, "0.0192", region=east),
        retail_item("Standard_NV6ads_A10_v5", "NV6ads A10 v5", nva10, "0.454", region=east),
        retail_item("Standard_ND40rs_v2", "ND40rs v2", ndv2, "2203.2", unit="100 Hours", region=east),
        retail_item(
            "",
            "P10 LRS Disk",
            "Premium SSD Managed Disks",
            "19.71",
            service_name="Storage",
            unit="1/Month",
            region=east,
        ),
        *_a100("Standard_NC24ads_A100_v4", "NC24ads A100 v4", "3.673", "1.623099", west),
        retail_item("Standard_NC4as_T4_v3", "NC4as T4 v3", t4, "0.526", region=west),
        retail_item("Standard_NC4as_T4_v3", "NC4as T4 v3 Spot", t4, "0.15254", region=west),
    ]


def _size(name: str, cores: int, memory_mb: int, disks: int = 8, resource_mb: int = 65536) -> dict[str, Any]:
    return {
        "name": name,
        "numberOfCores": cores,
        "osDiskSizeInMB": 1047552,
        "resourceDiskSizeInMB": resource_mb,
        "memoryInMB": memory_mb,
        "maxDataDiskCount": disks,
    }


def default_vm_sizes() -> dict[str, list[dict[str, Any]]]:
    """vmSizes per location (lower-case), in ARM's shape."""
    sizes = [
        _size("Standard_D2s_v3", 2, 8192, 4, 16384),
        _size("Standard_NC4as_T4_v3", 4, 28672, 8, 180224),
        _size("Standard_NC24ads_A100_v4", 24, 225280, 8, 65536),
        _size("Standard_ND96asr_v4", 96, 921600, 16, 6000000),
        _size("Standard_NV6ads_A10_v5", 6, 56320, 4, 184320),
    ]
    return {"eastus": sizes, "westus2": [s for s in sizes if s["name"] != "Standard_ND96asr_v4"]}


@dataclass
class Fault:
    """An injected failure: `kind` is "prices" or "vmsizes"; `page` (1-based) limits a prices fault to one page."""

    kind: str
    status: int
    retry_after: str | None = None
    page: int | None = None
    times: int = 1


@dataclass
class Recorded:
    kind: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str] = field(default_factory=dict)


class AzureFake:
    """The fake server. Use as a context manager; `prices_url` and `arm_url` are where clients point."""

    def __init__(
        self,
        items: list[dict[str, Any]] | None = None,
        vm_sizes: dict[str, list[dict[str, Any]]] | None = None,
        *,
        page_size: int = 4,
        vm_sizes_raw: dict[str, bytes] | None = None,
    ) -> None:
        self.items = default_items() if items is None else items
        self.vm_sizes = default_vm_sizes() if vm_sizes is None else vm_sizes
        self.vm_sizes_raw = vm_sizes_raw or {}  # lower-cased request path -> exact body (e.g. a real fixture)
        self.page_size = page_size
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.delays: dict[str, float] = {}
        self._lock = threading.Lock()
        self._server: QuietHTTPServer | None = None
        self._port: int | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------- control

    @property
    def port(self) -> int:
        assert self._port is not None, "the fake was never started"
        return self._port

    @property
    def arm_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def prices_url(self) -> str:
        return f"{self.arm_url}{PRICES_PATH}"

    def fail(self, kind: str, status: int, *, retry_after: str | None = None, page: int | None = None) -> None:
        with self._lock:
            self.faults.append(Fault(kind, status, retry_after, page))

    def delay(self, kind: str, seconds: float) -> None:
        self.delays[kind] = seconds

    def recorded(self, kind: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.kind == kind]

    def start(self) -> AzureFake:
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._port = int(self._server.server_address[1])
        self._stopped.clear()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="azure-fake", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()  # wakes delayed handlers, which then drop their connection unanswered
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> AzureFake:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -------------------------------------------------------------- behaviour

    def _take_fault(self, kind: str, page: int | None) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.kind == kind and (f.page is None or f.page == page):
                    f.times -= 1
                    if f.times <= 0:
                        self.faults.remove(f)
                    return f
        return None

    def prices(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        raw_filter = query.get("$filter", [""])[0]
        clauses = parse_filter(raw_filter)
        if clauses is None:
            error = {"Error": {"Code": "BadRequest", "Message": f"Invalid OData filter: {raw_filter}"}}
            return 400, {}, json.dumps(error).encode()
        try:
            skip = int(query.get("$skip", ["0"])[0])
        except ValueError:
            return 400, {}, b'{"Error": {"Code": "BadRequest", "Message": "Invalid $skip"}}'
        page_no = skip // self.page_size + 1
        fault = self._take_fault("prices", page_no)
        if fault is not None:
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            return fault.status, headers, json.dumps({"Error": {"Code": str(fault.status)}}).encode()
        matching = [i for i in self.items if matches(i, clauses)]
        page = matching[skip : skip + self.page_size]
        next_link: str | None = None
        if skip + self.page_size < len(matching):
            params = {k: v[0] for k, v in query.items() if k != "$skip"}
            params["$skip"] = str(skip + self.page_size)
            encoded = urlencode(params, quote_via=quote, safe="$'")
            next_link = f"{self.prices_url}?{encoded}"
        body: dict[str, Any] = {
            "BillingCurrency": "USD",
            "CustomerEntityId": "Default",
            "CustomerEntityType": "Retail",
            "Items": page,
            "NextPageLink": next_link,
            "Count": len(page),
        }
        return 200, {}, _dumps(body).encode()

    def sizes(
        self, path: str, location: str, query: dict[str, list[str]], auth: str
    ) -> tuple[int, dict[str, str], bytes]:
        if not auth.startswith("Bearer "):
            return _arm_error(401, "AuthenticationFailed", "Authentication failed.")
        if "api-version" not in query:
            return _arm_error(400, "MissingApiVersionParameter", "The api-version query parameter is required.")
        fault = self._take_fault("vmsizes", None)
        if fault is not None:
            code = "TooManyRequests" if fault.status == 429 else "InternalServerError"
            status, _, body = _arm_error(fault.status, code, f"injected {fault.status}")
            return status, ({"Retry-After": fault.retry_after} if fault.retry_after else {}), body
        raw = self.vm_sizes_raw.get(path.lower())
        if raw is not None:
            return 200, {}, raw
        sizes = self.vm_sizes.get(location.lower())
        if sizes is None:
            msg = f"No registered resource provider found for location '{location}'."
            return _arm_error(404, "NoRegisteredProviderFound", msg)
        return 200, {}, json.dumps({"value": sizes}).encode()


def _arm_error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    return status, {}, json.dumps({"error": {"code": code, "message": message}}).encode()


def parse_filter(text: str) -> list[tuple[str, str]] | None:
    """`field eq 'value' and ...` as (lower-cased field, exact value) pairs; None when it is anything else."""
    clauses: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    if not text:
        return clauses
    while True:
        m = _CLAUSE.match(text, pos)
        if m is None:
            return None
        clauses.append((m.group(1).lower(), m.group(2).replace("''", "'")))
        pos = m.end()
        if pos == len(text):
            return clauses
        if not text.startswith("and ", pos):
            return None
        pos += 4


def matches(item: dict[str, Any], clauses: list[tuple[str, str]]) -> bool:
    """Case-insensitive field names, case-SENSITIVE values, `priceType` read from the item's `type`."""
    by_lower = {k.lower(): v for k, v in item.items()}
    for name, value in clauses:
        key = "type" if name == "pricetype" else name
        if str(by_lower.get(key)) != value:
            return False
    return True


class _Handler(BaseHTTPRequestHandler):
    owner: AzureFake
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        headers = {k: v for k, v in self.headers.items()}
        if parts.path == PRICES_PATH:
            kind = "prices"
        elif _VMSIZES.match(parts.path):
            kind = "vmsizes"
        else:
            kind = "unknown"
        with self.owner._lock:
            self.owner.requests.append(Recorded(kind, parts.path, query, headers))
        delay = self.owner.delays.get(kind, 0.0)
        if delay and self.owner._stopped.wait(delay):
            self.close_connection = True
            return
        if kind == "prices":
            status, extra, body = self.owner.prices(query)
        elif kind == "vmsizes":
            m = _VMSIZES.match(parts.path)
            assert m is not None
            status, extra, body = self.owner.sizes(parts.path, m.group(2), query, self.headers.get("Authorization", ""))
        else:
            status, extra, body = 404, {}, b'{"error": {"code": "NotFound", "message": "no such path"}}'
        self._send(status, extra, body)

    def _send(self, status: int, extra: dict[str, str], body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass
