"""The relay: claim, publish, settle - the same loop for every store and publisher."""

from outboxer.relay.observer import NoopObserver, PublishOutcome, RelayObserver
from outboxer.relay.relay import Relay, RelayCounters

__all__ = ["NoopObserver", "PublishOutcome", "Relay", "RelayCounters", "RelayObserver"]
