"""Built-in simulated pools (a cloud market and an on-prem cluster), deterministic under a seed."""
