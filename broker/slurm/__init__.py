"""The broker's side of Slurm bursting: which pending Slurm jobs may burst (`policy`), how one becomes an Overspill job
(`job`) and what each Slurm account is allowed (`accounts`). The Slurm adapter itself is `providers.slurm`.

May import: `providers/`, `broker.api.schemas` (the job spec it builds), `broker.config` and `broker.observe`.
"""
