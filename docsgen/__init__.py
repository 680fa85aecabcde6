"""The documentation site's generators: reference pages built from the code at `mkdocs build` time.

`docsgen/hooks.py` is the MkDocs hook (named in mkdocs.yml) that adds the generated pages; each other module turns
one source of truth into Markdown and imports the product only inside its functions:

- `settings_ref`: every field of `broker.config.settings.Settings` (env var, type, default, description);
- `cli_ref`: the `overspill` command tree (Typer/click), every command with its options;
- `api_ref`: the REST API from the app's own OpenAPI document;
- `jobspec_ref`: the job spec (`broker.api.schemas.JobCreate`'s JSON schema);
- `protocol_ref`: the agent protocol (`agent/protocol.py`);
- `architecture`: the import rules (`tests/test_layering.py`'s docstring and `RULES`);
- `benchmarks`: one page per script in `benchmarks/`, with its committed JSON results and matplotlib plots.

Nothing here is imported by the product; tests/test_docs_site.py builds the pages in-process.
"""
