"""The control loop: `tick(now)` and its idempotent steps."""
