"""Tenant names: one rule wherever a tenant enters the broker (the bootstrap setting, `overspill keys create
--tenant`, key creation through the API or code), because tenant names end up in file names (reports) and object
store prefixes (checkpoints).

Contract: `validate_tenant(name) -> str` returns `name` unchanged when it matches `TENANT_PATTERN`, 1-63 characters
of lowercase letters, digits, `_` and `-`, starting with a letter or digit (so never `.`, `..`, `/`, whitespace or
uppercase); otherwise it raises `InvalidTenant` (a `ValueError`) saying what the rule is.
"""

from __future__ import annotations

import re

TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_TENANT = re.compile(TENANT_PATTERN.replace("$", r"\Z"))
RULE = "1-63 characters of a-z, 0-9, '_' and '-', starting with a letter or digit"


class InvalidTenant(ValueError):
    """A tenant name that breaks the rule."""


def validate_tenant(name: str) -> str:
    if not isinstance(name, str) or _TENANT.match(name) is None:
        raise InvalidTenant(f"invalid tenant name {str(name)[:80]!r}: {RULE}")
    return name
