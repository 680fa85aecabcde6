"""The settings of a CLI command, read from the environment: a bad `OVERSPILL_*` variable ends the command with one
line naming the variable and what is wrong (`broker.config.settings_errors`), exit code 2, never a traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.cli.output import usage_error

if TYPE_CHECKING:
    from broker.config.settings import Settings


def load_settings() -> Settings:
    """`Settings()` from the environment, or a one-line usage error naming the variable at fault."""
    from broker.config.settings import Settings
    from broker.config.settings_errors import explain

    try:
        return Settings()
    except ValueError as exc:  # pydantic's ValidationError and pydantic-settings' SettingsError are ValueErrors
        usage_error(explain(exc))
