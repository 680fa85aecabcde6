"""Observability: the Prometheus metrics (`metrics`) and the structured JSON logging (`logging_setup`).

May import: `providers/`, `broker.config` and `broker.store` (metrics read the tables at scrape time).
"""
