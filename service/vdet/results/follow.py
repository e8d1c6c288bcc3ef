"""Following every result of the hub from an event loop, in order, across the hub's lagging
cut-offs: what the notifier and the event history both do. A reader that falls behind resumes
from the replay buffer after the last result it saw; results that left the buffer unseen are
reported to `on_missed`."""

from __future__ import annotations

from collections.abc import Callable

from vdet.results.hub import HubResult, ResultsHub, SubscriptionEnd, SubscriptionEndedError


async def follow_results(
    hub: ResultsHub,
    on_result: Callable[[HubResult], object],
    on_missed: Callable[[int], object] = lambda missed: None,
    on_lagging: Callable[[int], object] = lambda after: None,
) -> None:
    """Call `on_result` with every result of every stream until the hub closes."""
    after = 0
    while True:
        sub = hub.subscribe(None, after)
        try:
            replay = sub.replay
            if replay.gap and replay.oldest_seq is not None:
                on_missed(max(0, replay.oldest_seq - after - 1))
            for result in replay.results:
                on_result(result)
                after = result.seq
            while True:
                result = await sub.get()
                on_result(result)
                after = result.seq
        except SubscriptionEndedError as end:
            if end.reason is not SubscriptionEnd.LAGGING:
                return  # the hub closed: the service is stopping
            on_lagging(after)
        finally:
            sub.close()
