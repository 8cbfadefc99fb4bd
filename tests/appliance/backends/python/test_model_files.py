"""model.py as Triton imports it (a module of package ``<version>``: sibling modules and relative imports
work), instance names in Triton's format, parameters without transport keys, errors in initialize()."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.backends.base import BackendRequest, model_parameters
from appliance.core.errors import ConfigError
from tests.appliance.backends.python.harness import loaded
from tests.models import copy_model, read_config

CONFIG = read_config("backends/packaged")


@pytest.mark.parametrize("index,name", [(0, "packaged_0_0"), (1, "packaged_0_1"), (2, "packaged_1_0")])
def test_model_py_is_a_package_module_and_names_its_instance_as_triton(tmp_path, index, name):
    model = copy_model(tmp_path, "backends/packaged")
    with loaded(model, CONFIG, instance_index=index) as backend:
        (result,) = backend.run_requests([BackendRequest({"x": np.array([1, 2], np.float32)}, ["y", "name"])]).results
        assert result["y"].tolist() == [2, 4]
        assert result["name"].tolist() == [name.encode()]


def test_request_parameters_leave_out_transport_keys():
    parameters = {"mode": "fast", "n": 1, "binary_data_output": True, "shared_memory_region": "r",
                  "sequence_id": 3, "sequence_start": True, "priority": 1, "timeout": 10, "triton_x": 1}
    assert model_parameters(parameters) == '{"mode": "fast", "n": 1}'


def test_an_exception_in_initialize_fails_the_load_with_its_message(tmp_path):
    model = copy_model(tmp_path, "backends/raises_in_initialize", "bad")
    with (pytest.raises(ConfigError, match="initialize\\(\\) of model 'bad' failed: RuntimeError: no weights found"),
          loaded(model, CONFIG)):
        pass


NO_INPUTS_CONFIG = read_config("backends/no_inputs")


def test_a_model_with_no_inputs_loads_as_under_triton(tmp_path):
    model = copy_model(tmp_path, "backends/no_inputs", "driver")
    with loaded(model, NO_INPUTS_CONFIG) as backend:
        assert backend.inputs() == []
        (result,) = backend.run_requests([BackendRequest({}, ["y"])]).results
        assert result["y"].tolist() == [0]


def test_a_model_sees_no_command_line_arguments(tmp_path):
    # As under Triton's stub (an embedded interpreter): unittest.main() in a model must not take the model
    # process's own arguments for test names.
    model = copy_model(tmp_path, "backends/unittests")
    with loaded(model, CONFIG) as backend:
        (result,) = backend.run_requests([BackendRequest({"x": np.zeros(2, np.float32)}, ["y"])]).results
    assert result["y"].tolist() == [1, 1]
