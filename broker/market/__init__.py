"""The market as the broker has stored it: the `PriceBook` loaded from the offering table (`catalog`) and each spot
pool's availability history (`availability`) that the deadline-aware strategy reads.

May import: `providers/`, `pricing/`, `federation/` and `broker.store`.
"""
