"""The pieces of ``triton_python_backend_utils`` (one module per concern); model.py files import the
whole surface from ``appliance.backends.python.model_process.triton_python_backend_utils``."""
