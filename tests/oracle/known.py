"""The documented differences from Triton, each tied by name to a row of the "Differences from Triton"
table, and able to undo exactly what its row describes.

A Difference names its table row (the "what" cell, verbatim), the corpus cases it may explain (fnmatch
patterns) and ``reconcile(triton, appliance)``: the appliance's answer with that one difference
undone, or None where the difference does not apply. A case whose answers differ is documented when
the differences matching it, applied in turn, make the two answers equal. A Difference that explains
no case any more is stale: the suite says so, so the table does not keep rows the code left behind.
"""

from __future__ import annotations

import copy
import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.oracle.wire import Answer

__all__ = ["DIFFERENCES", "Difference", "explain", "table_rows", "touching"]

Reconcile = Callable[[Answer, Answer], "Answer | None"]


@dataclass(frozen=True)
class Difference:
    row: str
    cases: tuple[str, ...]
    reconcile: Reconcile

    def applies_to(self, case_name: str) -> bool:
        return any(fnmatch.fnmatchcase(case_name, pattern) for pattern in self.cases)


def explain(case_name: str, triton: Answer, appliance: Answer,
            differences: Sequence[Difference]) -> list[Difference] | None:
    """The differences that together turn the appliance's answer into Triton's; None if they cannot."""
    used, current = _undo(case_name, triton, appliance, differences)
    return used if used and current.as_dict() == triton.as_dict() else None


def touching(case_name: str, triton: Answer, appliance: Answer,
             differences: Sequence[Difference]) -> list[Difference]:
    """The differences that change this case's answer at all (explaining all of it or not)."""
    return _undo(case_name, triton, appliance, differences)[0]


def _undo(case_name: str, triton: Answer, appliance: Answer,
          differences: Sequence[Difference]) -> tuple[list[Difference], Answer]:
    used: list[Difference] = []
    current = appliance
    for difference in differences:
        if not difference.applies_to(case_name):
            continue
        undone = difference.reconcile(triton, current)
        if undone is not None and undone.as_dict() != current.as_dict():
            used.append(difference)
            current = undone
    return used, current


def table_rows(root: Path) -> list[str]:
    """The "what" cells of the table, from docs/differences-from-triton.md (or the README's section)."""
    page = root / "docs" / "differences-from-triton.md"
    text = page.read_text() if page.exists() else _readme_section(root / "README.md")
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 4 and cells[0] not in ("what", "") and not set(cells[0]) <= {"-"}:
            rows.append(cells[0])
    return rows


def _readme_section(readme: Path) -> str:
    text = readme.read_text()
    match = re.search(r"^#+ Differences from Triton\n(.*?)(?=^#+ )", text, re.S | re.M)
    return match.group(1) if match else ""


# -- reconcilers ---------------------------------------------------------------------------------------

def _take_triton(when: Callable[[Answer, Answer], bool]) -> Reconcile:
    """The whole answer differs by design (status and words) when ``when`` holds."""
    def reconcile(triton: Answer, appliance: Answer) -> Answer | None:
        return copy.deepcopy(triton) if when(triton, appliance) else None
    return reconcile


def _statuses(triton_status: str, appliance_status: str) -> Callable[[Answer, Answer], bool]:
    return lambda triton, appliance: triton.status == triton_status and appliance.status == appliance_status


def _without_index_origin(triton: Answer, appliance: Answer) -> Answer | None:
    if not isinstance(appliance.body, list):
        return None
    body = [{key: value for key, value in row.items() if key != "origin"} if isinstance(row, dict) else row
            for row in appliance.body]
    return Answer(appliance.status, body, appliance.extra)


def _messages(answer: Answer) -> list[tuple[list[Any], str]]:
    """Where an answer carries error words: (container path, key) pairs, in order."""
    found: list[tuple[list[Any], str]] = []
    body = answer.body
    if isinstance(body, dict):
        for key in ("error", "message"):
            if isinstance(body.get(key), str):
                found.append(([], key))
        for index, event in enumerate(body.get("events") or []):
            if isinstance(event, dict) and isinstance(event.get("error"), str):
                found.append((["events", index], "error"))
        for index, response in enumerate(body.get("responses") or []):
            if isinstance(response, dict):
                for key in ("error_message", "stream_error"):
                    if isinstance(response.get(key), str):
                        found.append((["responses", index], key))
    return found


def _at(body: Any, path: list[Any]) -> Any:
    for step in path:
        body = body[step]
    return body


_HINT = re.compile(r"^(; |: | \()")


def _words_then_hint(triton: Answer, appliance: Answer) -> Answer | None:
    """Same status and shape; each appliance message is Triton's followed by what to change."""
    if triton.status != appliance.status:
        return None
    theirs, ours = _messages(triton), _messages(appliance)
    if [place for place in theirs] != [place for place in ours]:
        return None
    undone = copy.deepcopy(appliance)
    for path, key in ours:
        expected, actual = _at(triton.body, path)[key], _at(undone.body, path)[key]
        if actual != expected:
            if not (actual.startswith(expected) and _HINT.match(actual[len(expected):])):
                return None
            _at(undone.body, path)[key] = expected
    return undone


_PARSER = ("Unable to parse", "attempt to access", "attempt to get members", "failed to parse the request JSON")


def _parser_words(answer: Answer) -> bool:
    """Triton's HTTP front end passes RapidJSON's complaint on as a 500."""
    return isinstance(answer.body, dict) and any(words in str(answer.body.get("error", "")) for words in _PARSER)


def _load_refusal(appliance_status: str) -> Reconcile:
    """Triton answers a load it cannot do with 500 "failed to poll from model repository"; here the HTTP
    status says whose fault it is, and the words go on with what is wrong."""
    def reconcile(triton: Answer, appliance: Answer) -> Answer | None:
        if triton.status != "500" or appliance.status != appliance_status or not isinstance(appliance.body, dict):
            return None
        theirs, ours = str(triton.body.get("error", "")), str(appliance.body.get("error", ""))
        if not (theirs.endswith("failed to poll from model repository") and ours.startswith(theirs)):
            return None
        return copy.deepcopy(triton)
    return reconcile


def _with_cuda_extension(triton: Answer, appliance: Answer) -> Answer | None:
    if not isinstance(appliance.body, dict) or not isinstance(appliance.body.get("extensions"), list):
        return None
    extensions = list(appliance.body["extensions"])
    if "cuda_shared_memory" in extensions or "system_shared_memory" not in extensions:
        return None
    extensions.insert(extensions.index("system_shared_memory") + 1, "cuda_shared_memory")
    return Answer(appliance.status, {**appliance.body, "extensions": extensions}, appliance.extra)


def _default_trace_file(triton: Answer, appliance: Answer) -> Answer | None:
    """Triton's trace_file is empty; the appliance's default file lies under its state dir."""
    body = copy.deepcopy(appliance.body)
    if _error_words(triton).endswith("trace file name is not given") and appliance.status in ("200", "OK"):
        return copy.deepcopy(triton)  # Triton refuses per-model settings without a file; here there is one
    if isinstance(body, dict) and str(body.get("trace_file", "")).endswith("trace.json"):
        body["trace_file"] = ""
    elif isinstance(body, dict) and "settings" in body:
        values = body["settings"].get("trace_file", {}).get("value", [])
        if not (values and values[0].endswith("trace.json")):
            return None
        values[0] = ""
    else:
        return None
    return Answer(appliance.status, body, appliance.extra)


def _refused_setting(triton: Answer, appliance: Answer) -> Answer | None:
    words = _error_words(appliance)
    if appliance.status not in ("400", "INVALID_ARGUMENT"):
        return None
    ignored = triton.status in ("200", "OK") and words.startswith(("unknown trace setting", "unknown trace level",
                                                                  "unknown log setting"))
    bad_format = triton.status == "503" and "log_format" in words
    return copy.deepcopy(triton) if ignored or bad_format else None


def _error_words(answer: Answer) -> str:
    body = answer.body if isinstance(answer.body, dict) else {}
    return str(body.get("error", body.get("message", "")))


def _without_max_inflight(appliance: Answer) -> Answer | None:
    body = copy.deepcopy(appliance.body)
    config = body.get("config", body) if isinstance(body, dict) else None
    scheduling = config.get("ensemble_scheduling") if isinstance(config, dict) else None
    if not isinstance(scheduling, dict) or "max_inflight_requests" not in scheduling:
        return None
    del scheduling["max_inflight_requests"]
    return Answer(appliance.status, body, appliance.extra)


def _in_tritons_output_order(triton: Answer, appliance: Answer) -> Answer | None:
    """The same outputs (and raw contents with them), in the order Triton listed them."""
    theirs, ours = triton.body, appliance.body
    if not (isinstance(theirs, dict) and isinstance(ours, dict) and "outputs" in theirs and "outputs" in ours):
        return None
    order = [output.get("name") for output in theirs["outputs"]]
    names = [output.get("name") for output in ours["outputs"]]
    if sorted(order) != sorted(names) or order == names:
        return None
    body = copy.deepcopy(ours)
    position = [names.index(name) for name in order]
    body["outputs"] = [ours["outputs"][i] for i in position]
    if "raw_output_contents" in ours:
        body["raw_output_contents"] = [ours["raw_output_contents"][i] for i in position]
    return Answer(appliance.status, body, appliance.extra)


def _either(*whens: Callable[[Answer, Answer], bool]) -> Callable[[Answer, Answer], bool]:
    return lambda triton, appliance: any(when(triton, appliance) for when in whens)


DIFFERENCES: tuple[Difference, ...] = (
    Difference("error messages", ("*",), _words_then_hint),
    Difference("a request body Triton's JSON parser refuses (malformed JSON, a member of the wrong JSON type)",
               ("http.*",),
               _take_triton(lambda triton, appliance: _statuses("500", "400")(triton, appliance)
                            and _parser_words(triton))),
    Difference("repository index rows", ("http.repository.index.*",), _without_index_origin),
    Difference("server metadata `extensions`", ("*.server.metadata",), _with_cuda_extension),
    Difference("CUDA shared memory where CUDA cannot work", ("*.cudashm.register",),
               _take_triton(_either(_statuses("400", "501"), _statuses("INVALID_ARGUMENT", "UNIMPLEMENTED")))),
    Difference("a system shared-memory region that cannot be registered (no such object, a bad key, past the "
               "object's end, size 0)", ("*.shm.register.*",),
               _take_triton(_either(_statuses("500", "400"), _statuses("INTERNAL", "INVALID_ARGUMENT")))),
    Difference("an output's shared-memory region too small for it", ("*.shm.infer.output_too_small",),
               _take_triton(_either(_statuses("500", "400"), _statuses("INTERNAL", "INVALID_ARGUMENT")))),
    Difference("`trace_file` (trace settings)", ("*.trace.*",), _default_trace_file),
    Difference("trace and log settings with an unknown name or value", ("*.trace.*", "*.logging.*"), _refused_setting),
    Difference("an output named twice in one request", ("*.error.duplicate_output*",),
               _take_triton(lambda triton, appliance: triton.status in ("200", "OK")
                            and "already exists in request" in _error_words(appliance))),
    Difference("an input's JSON `data` nested deeper than Triton's limit", ("http.json.deep_strings",),
               _take_triton(lambda triton, appliance: triton.status == "200"
                            and "JSON nesting depth exceeds maximum allowed limit" in _error_words(appliance))),
    Difference("a JSON body that repeats a key (`/infer`)", ("http.error.json.duplicate_key",),
               _take_triton(_statuses("200", "400"))),
    Difference("the order of an ensemble's outputs in a response", ("*.infer.pipeline*",), _in_tritons_output_order),
    Difference("an ensemble's config JSON: `ensemble_scheduling.max_inflight_requests`", ("*.model.config.pipeline",),
               lambda triton, appliance: _without_max_inflight(appliance)),
    Difference("a load request's config or file override that cannot be used (JSON that is no model config; a file "
               "name with `..`, absolute, too long...)", ("http.load.*",), _load_refusal("400")),
    Difference("a load of a model the repository does not have", ("http.load.*",), _load_refusal("404")),
    Difference("`/infer` or `ModelInfer` on a decoupled model", ("*.error.decoupled_unary*",),
               _take_triton(_either(_statuses("501", "400"), _statuses("UNIMPLEMENTED", "INVALID_ARGUMENT")))),
    Difference("`generate` on a model that sends several (or no) responses", ("http.generate.decoupled_*",),
               _take_triton(_statuses("200", "400"))),
)
