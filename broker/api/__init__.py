"""The HTTP edge: what a request meets before a service runs, and the API's vocabulary.

`routes/` (one module per resource), `schemas` (the request and response models, the job spec), `deps` (FastAPI
dependencies: the runtime, the principal), `auth` (API keys, roles, callback tokens), `ratelimit`, `request_id`,
`audit` (the audit-log middleware), `problems` and `http_errors` (RFC 9457 problem answers) and `docs` (the
offline API docs page). The app itself is assembled in `broker.app`.

May import: every room below it (`broker.services`, `broker.store`, `broker.config`, `broker.observe`,
`broker.finance`), never `broker.loop` directly: a route calls a service.
"""
