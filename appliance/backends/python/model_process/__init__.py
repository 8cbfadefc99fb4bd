"""The model process's side of the Python backend: what runs beside a model.py (the stub serving the daemon's
commands, pb_utils), in the model's own process or, for the in-process plan, inside the daemon. It imports
nothing of the daemon but the channel and arenas it shares with it (``wire``) and the tensor datatypes, so
that a model's own environment (EXECUTION_ENV_PATH) needs nothing of the appliance's dependencies."""
