"""Price feeds and the PriceBook: current prices of every offering, with source and freshness."""
