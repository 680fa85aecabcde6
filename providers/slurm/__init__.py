"""The Slurm adapter: the on-prem cluster as a provider (`provider`), reached through a transport (`transport`: the
CLI over a local or SSH shell, or `rest`: slurmrestd), with Slurm's JSON (`json_api`) and text (`text`) output
parsed, accounting (`accounting`), batch-script directives (`script`), job dependencies (`dependency`) and
containers (`container`).

May import: `providers.model` and the other adapters' shared modules; never `federation/`, `pricing/` or `broker/`.
"""
