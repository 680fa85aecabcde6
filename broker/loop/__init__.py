"""The control loop: `tick(now)` (`tick`) and its idempotent steps, one module each (feeds, sync, mailbox,
accrue, place, move, return_onprem, onprem_burst, stage, interrupts...), run by `runner` in the background.

May import: `federation/` (every decision), `pricing/`, `providers/`, and the rooms below it (`broker.store`,
`broker.config`, `broker.market`, `broker.observe`, `broker.agent_side`, `broker.slurm`, `broker.finance`,
`broker.services`); never the HTTP edge's routes or the CLI.
"""
