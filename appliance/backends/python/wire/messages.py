"""The messages between the daemon and a model process: one class per kind, and how a frame holds one.

Both sides build these classes and match on them (``isinstance``, ``match`` on class patterns), never on
a tag. Each is a ``NamedTuple``: as cheap to build as a plain tuple, and it travels as one. On the
channel a message is the plain tuple ``(kind number, *fields)``, pickled (``encode``), and ``decode``
unpickles it with an unpickler that resolves no class at all: a frame can hold only plain data (tuples,
lists, dicts, strings, numbers), so a model process can make the daemon run nothing by what it sends,
and a frame that is not one of the kinds below, with its number of fields, is refused
(``MessageRefused``). Pickling a NamedTuple as itself would cost 3-6 us more per message (its class is
looked up by name on both sides, ``__getnewargs__`` runs in Python); this encoding costs ~0.5 us more
than the plain tuples it replaced, and the unpickler that refuses classes ~0.5 us more again (figures in
docs/performance.md).

``Done.packed`` holds one entry per request of the batch (``Produced``, ``Errored``, ``Sent``,
``Rescheduled``, or ``Failed`` for a request of a group whose own execute() raised): encoded the same way.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, NamedTuple

from appliance.core.errors import InferenceFailed

__all__ = [
    "ENTRIES", "KINDS", "Answer", "Ask", "Cancel", "Crashed", "Describe", "Described", "Done", "Entry", "Errored",
    "Execute", "ExecuteEach", "Failed", "Finalize", "Finalized", "Free", "Gone", "HandedOver", "Handover", "Infer",
    "Initialize", "Item", "Log", "Message", "MessageRefused", "MetricUpdate", "Produced", "Ready", "Rescheduled",
    "Response", "Result", "Sent", "decode", "encode",
]

BlockRef = tuple[int, str, int]
"""(block, arena path, arena size): as appliance.backends.python.wire.arena names it."""
Descriptors = list[tuple[str, str, tuple[int, ...], int, "int | bytearray"]]
ModelErrorArgs = tuple[str, int]
"""(message, TritonError code)."""


class MessageRefused(InferenceFailed):
    """A frame on the model-process channel that is not one of the message kinds (or a send of something
    that is not one): the other end runs another version of the appliance, or is not the appliance."""


# -- commands of the daemon, and their replies -----------------------------------------------------------

class Describe(NamedTuple):
    """Run auto_complete_config() on the model's config (Triton's JSON); answered by ``Described``."""

    config: dict[str, Any]


class Described(NamedTuple):
    config: dict[str, Any]


class Initialize(NamedTuple):
    """Run initialize(args); answered by ``Ready`` or ``Failed``."""

    args: dict[str, str]


class Ready(NamedTuple):
    pass


Item = tuple[int, Descriptors, list[str], str, "int | str", int, int, str]
"""One request of an ``Execute``'s batch, a flat record: its key, its input descriptors, the outputs it
asks for, its id, correlation id, flags, timeout (µs, 0: none) and parameters (JSON text). A plain
tuple on the channel (a dict a request cost its keys' pickling on both sides)."""


class Execute(NamedTuple):
    """Run execute() once on the batch; ``arena``: the input arena's ``info()`` (None: the inputs are carried
    inline), ``batch``: one ``Item`` a request. Answered by ``Done`` or ``Failed``."""

    arena: dict[str, Any] | None
    batch: list[Item]


class ExecuteEach(NamedTuple):
    """A group: execute() once per request, in order; one ``Done`` for all."""

    arena: dict[str, Any] | None
    batch: list[Item]


class Done(NamedTuple):
    """execute() returned: ``packed`` has one entry per request, written in the output arena ``arena``
    (its ``info()``; None when they are carried inline); both None when every request streams its responses."""

    arena: dict[str, Any] | None
    packed: list[Entry] | None


class Failed(NamedTuple):
    """initialize() or execute() raised (Triton's words for it, and the traceback); also the entry of a
    request of a group whose own execute() raised."""

    what: str
    traceback: str


class Finalize(NamedTuple):
    """Run finalize() and exit, once what runs is done; answered by ``Finalized``."""


class Finalized(NamedTuple):
    pass


class Crashed(NamedTuple):
    """The model process failed outside the model's calls (model.py did not import): it exits."""

    what: str
    traceback: str


class Handover(NamedTuple):
    """The daemon's event loop reads the channel from the echo (``HandedOver``) on."""


class HandedOver(NamedTuple):
    pass


# -- entries of Done.packed ---------------------------------------------------------------------------

class Produced(NamedTuple):
    """A response's outputs (in Done's arena) and its parameters (JSON text)."""

    descriptors: Descriptors
    parameters: str


class Errored(NamedTuple):
    """A response with an error: TritonError's message and code."""

    message: str
    code: int


class Sent(NamedTuple):
    """A request answered through its response sender (now, or later from another thread)."""


class Rescheduled(NamedTuple):
    """A request released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: it runs again."""


Entry = Produced | Errored | Sent | Rescheduled | Failed


# -- what either side sends of its own --------------------------------------------------------------

class Free(NamedTuple):
    """The sender is done with these blocks of the receiver's (their tensors were copied out)."""

    blocks: list[int]


class Infer(NamedTuple):
    """A BLS call: its inputs in the model process's block ``ref``; answered by ``Result`` (several,
    for a decoupled call)."""

    call: int
    ref: BlockRef | None
    descriptors: Descriptors
    meta: dict[str, Any]


class Result(NamedTuple):
    """One answer to a BLS call: outputs in the daemon's block ``ref``, or ``error``."""

    call: int
    ref: BlockRef | None
    descriptors: Descriptors
    error: ModelErrorArgs | None
    parameters: str | None
    final: bool


class Cancel(NamedTuple):
    """``ResponseIterator.cancel()`` of a decoupled BLS call."""

    call: int


class Ask(NamedTuple):
    """A question (is_cancelled, is_model_ready, load, unload, metrics); answered by ``Answer``."""

    call: int
    what: str
    args: tuple[Any, ...]


class Answer(NamedTuple):
    """``value`` when ``ok``, else the error's message."""

    call: int
    ok: bool
    value: Any


class Gone(NamedTuple):
    """Made by the model process itself for each call still open when the daemon went away."""

    call: int
    reason: str


class Response(NamedTuple):
    """A response sent through a request's response sender (a decoupled model's stream)."""

    key: int
    ref: BlockRef | None
    descriptors: Descriptors
    error: ModelErrorArgs | None
    parameters: str | None
    final: bool


class Log(NamedTuple):
    level: int
    text: str
    filename: str
    line: int


class MetricUpdate(NamedTuple):
    """A custom metric's update: ``operation`` is increment, set or observe."""

    operation: str
    metric_id: int
    value: float


Message = (Describe | Described | Initialize | Ready | Execute | ExecuteEach | Done | Failed | Finalize | Finalized
           | Crashed | Handover | HandedOver | Free | Infer | Result | Cancel | Ask | Answer | Gone | Response | Log
           | MetricUpdate)

KINDS: tuple[type[Message], ...] = (
    Describe, Described, Initialize, Ready, Execute, ExecuteEach, Done, Failed, Finalize, Finalized, Crashed,
    Handover, HandedOver, Free, Infer, Result, Cancel, Ask, Answer, Gone, Response, Log, MetricUpdate,
)
"""Every message kind; its index is its number on the channel (both ends run the same code)."""
ENTRIES: tuple[type[Entry], ...] = (Produced, Errored, Sent, Rescheduled, Failed)
"""The kinds of Done.packed's entries, numbered by their index."""

_NUMBERS = {kind: number for number, kind in enumerate(KINDS)}
_ENTRY_NUMBERS = {kind: number for number, kind in enumerate(ENTRIES)}
_SHAPES = {number: (kind, len(kind._fields) + 1) for number, kind in enumerate(KINDS)}
"""A kind's class and the length of its tuple on the channel, by its number."""
_ENTRY_SHAPES = {number: (kind, len(kind._fields) + 1) for number, kind in enumerate(ENTRIES)}
_PRODUCED = _ENTRY_NUMBERS[Produced]
_PICKLE = pickle.HIGHEST_PROTOCOL
"""Pickled directly (multiprocessing's ForkingPickler costs a pickler object per message)."""


def encode(message: Message) -> bytes:
    """One frame's bytes; MessageRefused for anything that is not one of ``KINDS``."""
    number = _NUMBERS.get(type(message))
    if number is None:
        raise MessageRefused(f"{type(message).__name__} is not a message of the model-process channel; send one of "
                             f"the classes of {__name__} ({', '.join(kind.__name__ for kind in KINDS)})")
    if type(message) is Done and message.packed:
        entries = [(_ENTRY_NUMBERS[type(entry)], *entry) for entry in message.packed]
        return pickle.dumps((number, message.arena, entries), _PICKLE)
    return pickle.dumps((number, *message), _PICKLE)


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise MessageRefused(f"a message of the model-process channel holds plain data only, not {module}.{name}")


def decode(data: bytes) -> Message:
    """The message in one frame's bytes; MessageRefused if they are not one of ``KINDS``."""
    try:
        fields = _PlainData(io.BytesIO(data)).load()
    except MessageRefused:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the bytes make pickle raise
        raise MessageRefused(f"a frame of the model-process channel is not a message ({type(exc).__name__}: "
                             f"{exc})") from None
    kind = _kind(fields, _SHAPES, "message")
    if kind is Done and fields[2] is not None:  # (made once, with its entries)
        if type(fields[2]) is not list:
            raise MessageRefused("a Done message's entries are not a list")
        # A Produced entry (the common one) is checked here: _kind's own checks, without its call.
        return tuple.__new__(Done, (fields[1], [
            tuple.__new__(Produced, entry[1:])
            if type(entry) is tuple and len(entry) == 3 and entry[0] == _PRODUCED and type(entry[0]) is int
            else tuple.__new__(_kind(entry, _ENTRY_SHAPES, "Done entry"), entry[1:]) for entry in fields[2]]))
    return tuple.__new__(kind, fields[1:])


def _kind(fields: Any, shapes: dict[int, tuple[Any, int]], what: str) -> Any:
    """The class of what ``fields`` (as pickle gave them) hold: a tuple of a known kind's number and as many
    fields as the kind has; MessageRefused for anything else."""
    shape = shapes.get(fields[0]) if type(fields) is tuple and fields and type(fields[0]) is int else None
    if shape is None:
        raise MessageRefused(f"a frame of the model-process channel is not a {what} of a known kind "
                             f"(starts {repr(fields)[:80]}); both ends must run the same version of the appliance")
    kind, size = shape
    if len(fields) != size:
        raise MessageRefused(f"a {kind.__name__} {what} has {size - 1} fields, not {len(fields) - 1}")
    return kind
