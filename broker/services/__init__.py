"""Service functions: one per API operation, no HTTP knowledge (the routes and the CLI call them).

May import: `broker.store`, `broker.config`, `broker.market`, `broker.agent_side`, `broker.finance`,
`broker.api.schemas` (the request models), `federation/`, `pricing/` and `providers/`.
"""
