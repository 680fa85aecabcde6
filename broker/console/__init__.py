"""The web console: a static single-page app served by the broker under /console (no build step, no CDN).

May import: FastAPI's static files and `broker.api` (it is mounted by `broker.app`).
"""
