"""Service functions: one per API operation, no HTTP knowledge."""
