"""Ensembles with decoupled Python steps (and the steps that answer once around them), shaped as Triton's
qa/L0_decoupled ensembles are: a decoupled step whose every response flows on through the steps after it,
decoupled steps in a row, a decoupled ensemble inside another, a step that sends its responses until it is
cancelled, and steps that leave out one of their outputs."""

from __future__ import annotations

from pathlib import Path

from tests.appliance.repository.ensemble.repos import ensemble_config, step, write_ensemble
from tests.models import copy_model

I1 = [1]

MODELS = ("decoupled/repeat", "decoupled/endless", "ensemble/slow_square", "ensemble/fan", "ensemble/partial",
          "ensemble/pick", "ensemble/tokens", "ensemble/tally", "ensemble/producer", "ensemble/span")
"""The steps' directories under tests/models (each model.py says what it does), served under their own names."""

REPEATED = [("IN", "TYPE_INT32", [-1])]


def decoupled_repository(repo: Path) -> Path:
    """The models above and these ensembles (every tensor INT32 [1] unless said):

    - ``rsq``: repeat(IN [-1]) -> slow_square: one (SQ, IDX) per element of IN, decoupled
    - ``rfan``: repeat -> fan: a decoupled step after a decoupled step (n responses of n per element)
    - ``inner`` = repeat alone (OUT, IDX), and ``outer`` = inner -> fan: a decoupled ensemble as a step
    - ``endless_chain``: endless(IN [1]) -> pick (+100): responses until the request is cancelled
    - ``partial_chain``: partial(X) -> (A, B never produced) -> pick(A, B): not decoupled
    - ``partial_out``: partial alone, both A and B ensemble outputs
    - ``tally_chain``: tokens(IN [-1]) -> tally: each response a request of sequence 42
    - ``flood``: producer(IN) -> pick (+100): as many responses as IN says, as fast as they are read
    - ``limited``: span(X) with ``max_inflight_requests: 1``
    """
    for source in MODELS:
        copy_model(repo, source)
    one = "TYPE_INT32"
    write_ensemble(repo, "rsq", ensemble_config(
        REPEATED, [("SQ", one, I1), ("IDX", "TYPE_UINT32", I1)],
        [step("repeat", {"IN": "IN"}, {"OUT": "r", "IDX": "IDX"}), step("slow_square", {"X": "r"}, {"Y": "SQ"})],
        max_batch_size=0))
    write_ensemble(repo, "rfan", ensemble_config(
        REPEATED, [("OUT", one, I1)],
        [step("repeat", {"IN": "IN"}, {"OUT": "r"}), step("fan", {"X": "r"}, {"OUT": "OUT"})], max_batch_size=0))
    write_ensemble(repo, "inner", ensemble_config(
        REPEATED, [("OUT", one, I1), ("IDX", "TYPE_UINT32", I1)],
        [step("repeat", {"IN": "IN"}, {"OUT": "OUT", "IDX": "IDX"})], max_batch_size=0))
    write_ensemble(repo, "outer", ensemble_config(
        REPEATED, [("OUT", one, I1)],
        [step("inner", {"IN": "IN"}, {"OUT": "r"}), step("fan", {"X": "r"}, {"OUT": "OUT"})], max_batch_size=0))
    write_ensemble(repo, "endless_chain", ensemble_config(
        [("IN", one, I1)], [("OUT", one, I1)],
        [step("endless", {"IN": "IN"}, {"OUT": "r"}), step("pick", {"A": "r"}, {"OUT": "OUT"})],
        max_batch_size=0))
    write_ensemble(repo, "partial_chain", ensemble_config(
        [("X", one, I1)], [("OUT", one, I1)],
        [step("partial", {"X": "X"}, {"A": "a", "B": "b"}), step("pick", {"A": "a", "B": "b"}, {"OUT": "OUT"})],
        max_batch_size=0))
    write_ensemble(repo, "partial_out", ensemble_config(
        [("X", one, I1)], [("A", one, I1), ("B", one, I1)],
        [step("partial", {"X": "X"}, {"A": "A", "B": "B"})], max_batch_size=0))
    write_ensemble(repo, "tally_chain", ensemble_config(
        REPEATED, [("SUM", one, I1), ("CORRID", "TYPE_UINT64", I1), ("FLAGS", one, I1)],
        [step("tokens", {"IN": "IN"}, {"OUT": "t"}),
         step("tally", {"X": "t"}, {"SUM": "SUM", "CORRID": "CORRID", "FLAGS": "FLAGS"})], max_batch_size=0))
    write_ensemble(repo, "flood", ensemble_config(
        [("IN", one, I1)], [("OUT", one, I1)],
        [step("producer", {"IN": "IN"}, {"OUT": "r"}), step("pick", {"A": "r"}, {"OUT": "OUT"})],
        max_batch_size=0))
    write_ensemble(repo, "limited", ensemble_config(
        [("X", one, I1)], [("SPAN", "TYPE_FP64", [2])], [step("span", {"X": "X"}, {"SPAN": "SPAN"})],
        max_batch_size=0).replace("ensemble_scheduling {", "ensemble_scheduling { max_inflight_requests: 1"))
    return repo
