"""The `overspill` command line: `main` (the Typer app and its commands), `db` (commands that open the database
directly) and `output` (tables and money as people read them).

Kept light on purpose: importing this package imports nothing; the commands that speak HTTP use `overspill.client`.
May import: any room of the broker (it is the top, beside `broker.app`).
"""
