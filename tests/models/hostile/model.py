"""A model.py whose execute() misbehaves as its requests' MODE says: every way a model can answer wrongly,
or not at all, that the server must survive (tests/appliance/backends/python/test_hostile_e2e.py and
test_hostile_in_process.py). Where a mode answers, Y is X. A batch holds requests of one mode."""

import json
import os
import resource
import threading
import time

import triton_python_backend_utils as pb_utils

MEMORY_HEADROOM = 128 << 20
"""Address space exhaust_memory may map beyond what the process has when it starts: the test box is shared."""
FORK_LINGERS = 60.0
"""Seconds a forked child lingers, past its parent's exit (the test kills it sooner)."""


def _echo(request):
    x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
    return pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)])


def _mode(request):
    return pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0].decode()


def _address_space():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


class TritonPythonModel:
    def initialize(self, args):
        self.directory = args["model_repository"]
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def execute(self, requests):
        return getattr(self, "_" + _mode(requests[0]))(requests)

    def _echo(self, requests):
        if not self.decoupled:
            return [_echo(request) for request in requests]
        for request in requests:
            request.get_response_sender().send(_echo(request), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def _raise(self, requests):
        raise RuntimeError("the hostile model raised")

    def _none(self, requests):
        return None

    def _list_of_none(self, requests):
        return [None for _ in requests]

    def _short(self, requests):
        return []

    def _long(self, requests):
        return [_echo(request) for request in requests] * 2

    def _string(self, requests):
        return "garbage"

    def _dict(self, requests):
        return {"Y": [1, 2]}

    def _list_of_string(self, requests):
        return ["garbage" for _ in requests]

    def _returns_responses(self, requests):
        """For a decoupled model, which must return None."""
        return [_echo(request) for request in requests]

    def _block(self, requests):
        threading.Event().wait()

    def _exit(self, requests):
        os._exit(3)

    def _close_stdout(self, requests):
        os.close(1)
        os.write(1, b"written after closing stdout\n")  # raises: fd 1 is closed

    def _write_fd1(self, requests):
        # What the channel's frames look like (a length, then bytes), and noise, on the process's stdout.
        os.write(1, b"\x00\x00\x00\x08hostile!" + bytes(range(256)) + b"\nhostile stdout garbage\n")
        return [_echo(request) for request in requests]

    def _fork(self, requests):
        child = os.fork()
        if child == 0:  # lingers, holding whatever it inherited
            time.sleep(FORK_LINGERS)
            os._exit(0)
        with open(os.path.join(self.directory, "children.txt"), "a") as children:
            children.write(f"{child}\n")
        return [_echo(request) for request in requests]

    def _exhaust_memory(self, requests):
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = _address_space() + MEMORY_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
        held = []
        while True:  # until MemoryError, which fails this batch; what it held is freed with it
            held.append(bytearray(8 << 20))
