"""Pure decision logic (placement, ceilings, bursting). No SDK, database, HTTP or clock imports: `now` is passed in."""
