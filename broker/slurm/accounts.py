"""The Slurm account policies of `OVERSPILL_SLURM_ACCOUNTS` (see `broker.slurm.policy` for what they govern).

Kept apart from the burst logic so the settings can validate them at start-up without importing the database
layer: a bad entry stops the broker with an error naming the account and the field.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from broker.api.schemas import Label, Usd

DEFAULT_ENTRY = "*"
TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_IMAGE_CHARS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")


class SlurmAccountPolicy(BaseModel):
    """What one Slurm account's users may do when their jobs burst (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(description="the broker tenant the bursts belong to")
    team: Label = "default"
    project: Label = "default"
    burst: bool = Field(default=False, description="whether the account's jobs may burst at all")
    max_job_usd: Usd | None = Field(default=None, description="the largest ceiling one burst job may have")
    monthly_budget_usd: Usd | None = Field(default=None, description="cloud spend of the account per UTC month")
    allowed_images: list[str] = Field(default_factory=list, max_length=256)
    users: list[str] | None = Field(default=None, description="only these Slurm users of the account may burst")
    qos: list[str] | None = Field(default=None, description="only jobs in these QOS may burst")
    allowed_providers: list[Label] | None = Field(default=None, description="clouds the bursts may use")

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        if not TENANT_RE.match(value):
            raise ValueError(f"{value!r} is not a tenant name (^[a-z0-9][a-z0-9_-]{{0,62}}$)")
        return value

    @field_validator("allowed_images")
    @classmethod
    def _images(cls, values: list[str]) -> list[str]:
        for v in values:
            if len(v) > 300 or not _IMAGE_CHARS.match(v.removesuffix("*")) or ("*" in v and not _is_prefix(v)):
                raise ValueError(f"{v!r} is not an image reference or a prefix ending in /*, :* or @*")
        return values

    @model_validator(mode="after")
    def _ceiling(self) -> SlurmAccountPolicy:
        if self.burst and self.max_job_usd is None:
            raise ValueError("an account that may burst needs max_job_usd")
        return self


def _is_prefix(pattern: str) -> bool:
    return pattern.count("*") == 1 and pattern[-2:] in ("/*", ":*", "@*")


def image_allowed(image: str, allowed: Sequence[str]) -> bool:
    """Exact match, or a `prefix*` entry whose remainder holds no path step upwards."""
    for entry in allowed:
        if entry == image:
            return True
        if entry.endswith("*") and image.startswith(entry[:-1]) and len(image) > len(entry) - 1:
            rest = image[len(entry) - 1 :]
            if ".." not in rest and _IMAGE_CHARS.match(rest):
                return True
    return False
