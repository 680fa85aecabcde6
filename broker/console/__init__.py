"""The web console: a static single-page app served by the broker under /console (no build step, no CDN)."""
