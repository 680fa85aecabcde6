"""Provider adapters: the shared domain types and one small contract per kind of capacity."""
