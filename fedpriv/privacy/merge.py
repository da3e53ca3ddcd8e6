"""Event merging: a history of events as one event whose identical leaves are counted once,
R rounds of dpsgd_event(σ, q, s) as dpsgd_event(σ, q, R·s). A ledger keeps each client's
leaf counts (``count_leaves``) and composes ``merged_event`` of them with one accountant."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fedpriv.privacy.events import ComposedEvent, DpEvent, SelfComposedEvent


def count_leaves(events: Iterable[DpEvent], counts: Mapping[DpEvent, int] | None = None) -> dict[DpEvent, int]:
    """{leaf: count} of ``events`` run in sequence, added to a copy of ``counts``: Composed
    and SelfComposed unrolled into counts of leaves (mechanisms or Poisson-sampled
    mechanisms), in first-seen order (a leaf seen with count 0 keeps its place)."""
    out = dict(counts or {})

    def walk(event: DpEvent, n: int) -> None:
        match event:
            case SelfComposedEvent(event=inner, count=k):
                walk(inner, n * k)
            case ComposedEvent(events=inner):
                for e in inner:
                    walk(e, n)
            case _:
                out[event] = out.get(event, 0) + n

    for event in events:
        walk(event, 1)
    return out


def merged_event(counts: Mapping[DpEvent, int]) -> DpEvent:
    """SelfComposed(leaf, count) of each leaf with count > 0, in order; one event or a Composed."""
    merged = tuple(SelfComposedEvent(leaf, n) for leaf, n in counts.items() if n > 0)
    return merged[0] if len(merged) == 1 else ComposedEvent(merged)


def merge_events(events: Iterable[DpEvent]) -> DpEvent:
    """One event equivalent to running ``events`` in sequence, with identical leaf events
    merged (``count_leaves``), rebuilt as SelfComposed(leaf, total count) in first-seen
    order. R rounds of dpsgd_event(σ, q, s) become dpsgd_event(σ, q, R·s)."""
    return merged_event(count_leaves(events))
