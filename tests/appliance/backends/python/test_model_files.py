"""model.py as Triton imports it (a module of package ``<version>``: sibling modules and relative imports
work), instance names in Triton's format, parameters without transport keys, errors in initialize()."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.backends.base import BackendRequest, model_parameters
from appliance.core.errors import ConfigError
from tests.appliance.backends.python.harness import loaded
from tests.models import write_python_model

CONFIG = """
backend: "python"
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "name" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_CPU } ]
"""

PACKAGED = """
import numpy as np
import triton_python_backend_utils as pb_utils

from .helpers import double
from helpers import double as double_too


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("y", double(x) + double_too(x) * 0),
                pb_utils.Tensor("name", np.array([self.name.encode()], dtype=object))]))
        return out
"""

HELPERS = """
def double(x):
    return x * 2
"""


@pytest.mark.parametrize("index,name", [(0, "packaged_0_0"), (1, "packaged_0_1"), (2, "packaged_1_0")])
def test_model_py_is_a_package_module_and_names_its_instance_as_triton(tmp_path, index, name):
    model = write_python_model(tmp_path, "packaged", PACKAGED, CONFIG, files={"helpers.py": HELPERS})
    with loaded(model, CONFIG, instance_index=index) as backend:
        (result,) = backend.run_requests([BackendRequest({"x": np.array([1, 2], np.float32)}, ["y", "name"])]).results
        assert result["y"].tolist() == [2, 4]
        assert result["name"].tolist() == [name.encode()]


def test_request_parameters_leave_out_transport_keys():
    parameters = {"mode": "fast", "n": 1, "binary_data_output": True, "shared_memory_region": "r",
                  "sequence_id": 3, "sequence_start": True, "priority": 1, "timeout": 10, "triton_x": 1}
    assert model_parameters(parameters) == '{"mode": "fast", "n": 1}'


RAISES_IN_INITIALIZE = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no weights found")

    def execute(self, requests):
        return []
"""


def test_an_exception_in_initialize_fails_the_load_with_its_message(tmp_path):
    model = write_python_model(tmp_path, "bad", RAISES_IN_INITIALIZE, CONFIG)
    with (pytest.raises(ConfigError, match="initialize\\(\\) of model 'bad' failed: RuntimeError: no weights found"),
          loaded(model, CONFIG)):
        pass


NO_INPUTS_CONFIG = """
backend: "python"
output [ { name: "y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

NO_INPUTS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", np.array([len(r.inputs())], np.int32))])
                for r in requests]
"""


def test_a_model_with_no_inputs_loads_as_under_triton(tmp_path):
    model = write_python_model(tmp_path, "driver", NO_INPUTS, NO_INPUTS_CONFIG)
    with loaded(model, NO_INPUTS_CONFIG) as backend:
        assert backend.inputs() == []
        (result,) = backend.run_requests([BackendRequest({}, ["y"])]).results
        assert result["y"].tolist() == [0]


UNITTEST = """
import sys
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class Checks(unittest.TestCase):
    def test_one(self):
        self.assertEqual(1, 1)


class TritonPythonModel:
    def execute(self, requests):
        result = unittest.main("model", exit=False, argv=None)  # Triton's qa models run their tests so
        ran = result.result.testsRun if result.result.wasSuccessful() else -1
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", np.array([ran, len(sys.argv)], np.float32)),
                                            pb_utils.Tensor("name", np.array([b""], dtype=object))])
                for _ in requests]
"""


def test_a_model_sees_no_command_line_arguments(tmp_path):
    # As under Triton's stub (an embedded interpreter): unittest.main() in a model must not take the model
    # process's own arguments for test names.
    model = write_python_model(tmp_path, "unittests", UNITTEST, CONFIG)
    with loaded(model, CONFIG) as backend:
        (result,) = backend.run_requests([BackendRequest({"x": np.zeros(2, np.float32)}, ["y"])]).results
    assert result["y"].tolist() == [1, 1]
