"""Live price feeds, one module per provider. Each feed is an `OfferingSource` (providers.base): it has a
`name` and `offerings(now) -> list[Offering]`, builds on the provider's real client (injected), and raises
`pricing.feeds.FeedError` with a clear message when the provider's answer cannot be used."""


class FeedError(Exception):
    """A feed failed or returned something unusable. The broker keeps the feed's last good prices."""

    def __init__(self, feed: str, message: str) -> None:
        super().__init__(f"{feed}: {message}")
        self.feed = feed
