"""OpenVINO's errors, as the log and the selection report show them."""

from __future__ import annotations

from appliance.backends.openvino import openvino_reason

# What OpenVINO 2026.4 raised for the example repository's simple_string on CPU.
STRING_CONVERT = """Exception from src/inference/src/cpp/core.cpp:117:
Exception from src/inference/src/dev/plugin.cpp:54:
Check 'newNode' failed at src/plugins/intel_cpu/src/node.cpp:1626:
Unsupported operation of type: Convert name: a
Details:
Exception from src/plugins/intel_cpu/src/nodes/convert.cpp:61:
Not Implemented:
cpu_convert can't convert from: string precision to: i32

Exception from src/plugins/intel_cpu/src/nodes/reference.cpp:36:
Not Implemented:
Cannot fallback on ngraph reference implementation. Ngraph::Node::evaluate() is not implemented for op: opset1::Convert

"""


def test_a_stack_of_frames_becomes_the_lines_that_say_what_is_wrong():
    reason = openvino_reason(RuntimeError(STRING_CONVERT))
    assert "\n" not in reason and "Exception from" not in reason and len(reason) <= 300
    assert reason.startswith("Unsupported operation of type: Convert name: a; cpu_convert can't convert from: "
                             "string precision to: i32")


def test_a_plain_message_is_kept_and_a_long_one_is_bounded():
    assert openvino_reason(RuntimeError("model file is empty")) == "model file is empty"
    assert openvino_reason(RuntimeError("")) == "RuntimeError"
    assert len(openvino_reason(RuntimeError("x" * 5000))) == 300
