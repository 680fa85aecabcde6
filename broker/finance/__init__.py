"""Finance: the cost ledger (`ledger`, `money`), budgets, bills, cost queries, and the scheduled reports to finance
teams (`reports/`) with their outbound delivery (`outbound`, `notify`).

May import: `broker.store`, `broker.config`, `broker.api.schemas`, `pricing/` and `providers/`.
"""
