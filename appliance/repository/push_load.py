"""A model loaded from pushed files: the one way pushed files become a served model, for the load API's
file overrides (appliance.protocol.repository_control) and for a Python model's
``pb_utils.load_model(name, config=..., files=...)`` (appliance.repository.bls). Both go through the same
checks (names confined, sizes bounded: appliance.repository.pushed) and the same store on disk."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from appliance.core.errors import ConfigError, InvalidInput, LoadRefused, PayloadTooLarge, PushRefused, PushTooLarge
from appliance.repository.config import config_from_json
from appliance.repository.pushed import PushStore, check_push_name, file_parameters
from appliance.repository.served import Models

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as mc

__all__ = ["checked_push", "config_override", "load_push"]


def config_override(name: str, parameters: Mapping[str, Any]) -> mc.ModelConfig | None:
    """The ``config`` parameter (JSON) as a checked config, None when absent."""
    if "config" not in parameters:
        return None
    try:
        return config_from_json(parameters["config"], name)
    except ConfigError as exc:  # Triton's words first, then what is wrong
        raise LoadRefused(f"failed to load '{name}', failed to poll from model repository: {exc.message}") from None


def checked_push(store: PushStore, name: str, parameters: Mapping[str, Any]) -> tuple[mc.ModelConfig, dict[str, bytes]]:
    """The pushed config and files of a load request (``config`` and ``file:<path>`` parameters), checked;
    a refusal carries Triton's words first ("failed to poll from model repository" is what Triton says
    of file overrides it cannot use), then what is wrong."""
    try:
        check_push_name(name)
        if "config" not in parameters:  # Triton's rule: the override directory's files come with a config
            raise InvalidInput("file overrides need the 'config' parameter (the model's configuration as JSON): "
                               "the pushed files replace the model's directory")
        override = config_override(name, parameters)
        assert override is not None
        files = file_parameters(parameters, store.limits.max_file_bytes)
        if not any("/" in relative and relative.split("/")[0].isdigit() for relative in files):
            raise InvalidInput("the pushed files have no version directory; send the model file as "
                               "'file:1/<file name>' (e.g. file:1/model.onnx)")
    except LoadRefused as exc:  # a config it cannot use: the words are there already
        raise PushRefused(exc.message) from None
    except (InvalidInput, PayloadTooLarge) as exc:
        refusal = PushTooLarge if isinstance(exc, PayloadTooLarge) else PushRefused
        raise refusal(f"failed to load '{name}', failed to poll from model repository: {exc.message}") from None
    return override, files


async def load_push(registry: Models, store: PushStore, name: str, override: mc.ModelConfig,
                    files: dict[str, bytes]) -> None:
    """Stage the files, load the model from them beside the serving versions (requests switch over once it
    is ready), then keep them as the model's overlay; a failed load leaves nothing behind."""
    with registry.hold(name):
        staged = await asyncio.to_thread(store.stage, name, override, files)
        try:
            await registry.load(name, None, source=staged.model_dir)
        except BaseException:
            await asyncio.to_thread(store.discard, staged)
            if not registry.in_repository(name) and name not in store.model_dirs():
                registry.forget(name)  # a failed first push leaves no entry behind
            raise
        try:
            replaced = await asyncio.to_thread(store.commit, staged)
        except BaseException:  # a disk that filled up between the files and origin.json: back to before
            await asyncio.to_thread(store.discard, staged)
            await _serve_previous(registry, store, name)
            raise
        if replaced is not None:  # the versions it served are closed by now
            await asyncio.to_thread(store.remove_generation, replaced)


async def _serve_previous(registry: Models, store: PushStore, name: str) -> None:
    """After a push that loaded but could not be kept: serve what served before it, or nothing."""
    previous = store.model_dirs().get(name)
    if previous is not None:
        await registry.load(name, None, source=previous, raise_errors=False)
    elif registry.in_repository(name):
        await registry.load(name, None, source=registry.repository / name, raise_errors=False)
    else:
        await registry.unload(name)
        registry.forget(name)
