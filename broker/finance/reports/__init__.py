"""Cost reports: a period's ledger rendered as CSV, FOCUS 1.2, HTML with charts or PDF, run on a schedule and
delivered to a directory, S3, email or a webhook. See `render.render` and `runs.run_report`."""
