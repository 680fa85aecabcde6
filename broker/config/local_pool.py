"""Building the local pool (providers/local) from the settings, and its default checkpoint store.

- `local_pool_enabled(settings)`: `OVERSPILL_LOCAL_POOL` when set; `overspill serve` sets it on when unset, so
  `make run` offers this machine next to the simulated market, while an embedded broker (tests, the demo) has no
  local pool unless asked.
- `build_local_pool(settings)`: this machine (`OVERSPILL_LOCAL_POOL_THIS_MACHINE`, its GPUs or
  `OVERSPILL_LOCAL_POOL_SLOTS` CPU slots) and each of `OVERSPILL_LOCAL_POOL_HOSTS` over SSH, at
  `OVERSPILL_LOCAL_POOL_RATE_USD_PER_HOUR` per slot-hour. A bad host entry raises ValueError naming the variable.
- `with_local_store(settings)`: the settings with a checkpoint store for the pool when none is configured for
  provider `local`: `file://<data_dir>-checkpoints/` (beside the data directory, never inside it: the store
  rules keep checkpoints out of the broker's own directories). SSH hosts read and write it only if it is on a
  filesystem they share; otherwise configure a store they reach (`OVERSPILL_CHECKPOINT_STORES`, `local/<host>`).
"""

from __future__ import annotations

import os
from pathlib import Path

from broker.config.settings import Settings
from providers.local.hosts import SshHost
from providers.local.pool import CPU, LocalPool, PoolHost, this_machine

HOSTS_VAR = "OVERSPILL_LOCAL_POOL_HOSTS"
THIS_MACHINE = "local"
_HOST_KEYS = {"ssh", "port", "identity_file", "known_hosts", "slots", "accelerator", "root", "gpu_memory_gib"}


def local_pool_enabled(settings: Settings) -> bool:
    return bool(settings.local_pool)


def pool_root(settings: Settings) -> str:
    return str((settings.local_pool_root or settings.data_dir / "pool").resolve())


def build_local_pool(settings: Settings) -> LocalPool:
    hosts: list[PoolHost] = []
    if settings.local_pool_this_machine:
        hosts.append(this_machine(pool_root(settings), slots=settings.local_pool_slots,
                                  accelerator=settings.local_pool_accelerator))  # fmt: skip
    for name, entry in settings.local_pool_hosts.items():
        hosts.append(_ssh_host(name, entry))
    if not hosts:
        raise ValueError(f"OVERSPILL_LOCAL_POOL is on but offers no host: set {HOSTS_VAR} or keep this machine")
    return LocalPool(hosts, broker_id=settings.broker_id, rate_usd_per_hour=settings.local_pool_rate_usd_per_hour)


def _ssh_host(name: str, entry: dict[str, str | int]) -> PoolHost:
    where = f"{HOSTS_VAR}[{name!r}]"
    if name == THIS_MACHINE or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"{where}: a host name is letters, digits, '.', '-', '_' and not {THIS_MACHINE!r}")
    stray = sorted(set(entry) - _HOST_KEYS)
    if stray:
        raise ValueError(f"{where}: unknown keys {', '.join(stray)} (known: {', '.join(sorted(_HOST_KEYS))})")
    if not entry.get("ssh"):
        raise ValueError(f"{where}: 'ssh' (user@host) is required")
    try:
        slots = int(entry.get("slots", 1))
        port = int(entry["port"]) if "port" in entry else None
        memory = int(entry.get("gpu_memory_gib", 0))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if slots < 1:
        raise ValueError(f"{where}: slots must be at least 1")
    root = str(entry.get("root", "/var/tmp/overspill-pool"))
    if not root.startswith("/"):
        raise ValueError(f"{where}: root must be an absolute path")
    accelerator = str(entry.get("accelerator", CPU))
    identity = entry.get("identity_file")
    known = entry.get("known_hosts")
    host = SshHost(
        name,
        str(entry["ssh"]),
        port=port,
        identity_file=os.path.expanduser(str(identity)) if identity else None,
        known_hosts=os.path.expanduser(str(known)) if known else None,
    )
    if accelerator != CPU and not memory:
        from providers.accelerators import memory_gib

        memory = memory_gib(accelerator)
    return PoolHost(host, root, slots, accelerator, memory, slots if accelerator == CPU else 0)


def with_local_store(settings: Settings) -> Settings:
    """The settings with a default checkpoint store for the local pool (see the module docstring)."""
    if not local_pool_enabled(settings) or any(k.split("/", 1)[0] == "local" for k in settings.checkpoint_stores):
        return settings
    data = Path(settings.data_dir).resolve()
    store = data.with_name(data.name + "-checkpoints")
    store.mkdir(parents=True, exist_ok=True)
    stores = {**settings.checkpoint_stores, f"local/{THIS_MACHINE}": store.as_uri() + "/"}
    return settings.model_copy(update={"checkpoint_stores": stores})
