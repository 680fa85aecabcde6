"""Configuration: everything an operator sets, read once per process and validated before anything starts.

`settings` (every `OVERSPILL_*` variable, one pydantic declaration), `providers` and `launch` (which clouds are on and
how their instances launch), `feeds` (live price feeds), `checkpoint_stores` (where checkpoints may live), `secrets`
(values kept in a secret store) and `tenants` (the one rule for tenant names).

May import: `providers/`, `pricing/`, `federation/` (domain types), `broker.store.tables` (the feed rows),
`broker.slurm.accounts` and `broker.agent_side.checkpoint_layout` (declarations they validate). Never the HTTP edge,
the loop or the services.
"""
