"""Live progress inside an episode, for whoever is watching: the demo, `parser.cli.ask`, eval's bar.

An episode can take minutes on a CPU; without this, the demo printed nothing and eval's bar sat
at `0/3` until a whole sample ended. The engine reports each finished turn here; a watcher
listens for the duration of one task. A context variable, not a parameter, because the turn is
finished deep inside whichever method runs the engine (ParSer, RAG, DCI, LongHarness...), and
every method would otherwise have to thread a callback it does not use through `run(sample)`.
Each asyncio task has its own copy of the context, so concurrent samples report to their own
listener.

    with progress.listening(lambda doc_id, turn: print(doc_id, turn.index, turn.answer)):
        result = await method.run(sample)
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from parser.records.trajectory import Turn

TurnListener = Callable[[str, "Turn"], None]
_listener: contextvars.ContextVar[TurnListener | None] = contextvars.ContextVar("parser_turn_listener", default=None)


@contextlib.contextmanager
def listening(listener: TurnListener) -> Iterator[None]:
    """Call `listener(doc_id, turn)` after every turn the episodes of this task finish."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def turn_finished(doc_id: str, turn: "Turn") -> None:
    """Called by the engine once a turn's action and tool results are recorded."""
    listener = _listener.get()
    if listener is not None:
        listener(doc_id, turn)
