"""`from overspill.client import Client`: the typed HTTP client of the Overspill API (defined in broker/client.py,
the one the `overspill` CLI uses). See that module for the three-line submit / watch / cancel example."""

from broker.client import TERMINAL_STATES, ApiError, BrokerClient, Client

__all__ = ["TERMINAL_STATES", "ApiError", "BrokerClient", "Client"]
