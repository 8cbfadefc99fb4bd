"""Which Python backend loads a model: a process per instance (the default, Triton's isolation), or the
daemon itself when selection chose the in-process plan the operator allowed.

The choice is read from ``LoadContext.plan``, which the loader and the tuning bench set from selection's
plan, never from the config: a config (in the repository, or pushed through the load API) only asks for
the plan to be considered (``parameters in_process``), and selection offers it there alone (not to
decoupled models), measures it and shows it in ``/selection``."""

from __future__ import annotations

import logging

from appliance.backends.base import Backend, LoadContext

__all__ = ["IN_PROCESS_PLAN_ID", "load_python"]

log = logging.getLogger(__name__)

IN_PROCESS_PLAN_ID = "python:in-process"
"""The plan (appliance.selection.plans) that runs model.py inside the daemon."""

_RETIRED_MARKER = "python_plan"
"""The config parameter that once carried the plan to this factory, where any config could set it."""


def load_python(context: LoadContext) -> Backend:
    if context.instance_index == 0 and not context.plan and _RETIRED_MARKER in context.config.parameters:
        # Said once per load (the first instance, before any plan is chosen), not once per instance.
        log.warning("model %r: parameters %s is ignored (it is no model parameter the daemon reads): a Python "
                    "model runs in a process of its own unless selection chose the in-process plan, which a "
                    "config allows with parameters in_process: \"true\" (see docs/python-backend.md)",
                    context.model_name, _RETIRED_MARKER)
    if context.plan.partition("@")[0] == IN_PROCESS_PLAN_ID:
        from appliance.backends.python.in_process import InProcessPythonBackend

        return InProcessPythonBackend(context)
    from appliance.backends.python.backend import PythonBackend

    return PythonBackend(context)
