"""Which Python backend loads a model: a process per instance (the default, Triton's isolation), or the
daemon itself when selection chose the in-process plan the operator allowed."""

from __future__ import annotations

from appliance.backends.base import Backend, LoadContext

__all__ = ["load_python"]


def load_python(context: LoadContext) -> Backend:
    from appliance.backends.python.in_process import PLAN_PARAMETER, InProcessPythonBackend

    if context.parameter(PLAN_PARAMETER) == "in-process":
        return InProcessPythonBackend(context)
    from appliance.backends.python.backend import PythonBackend

    return PythonBackend(context)
