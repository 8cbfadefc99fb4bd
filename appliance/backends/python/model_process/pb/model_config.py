"""The model config as model.py sees it: lookups, and ``auto_complete_config``'s ModelConfig, which
merges what the model declares with what config.pbtxt says and refuses conflicts as Triton does."""

from __future__ import annotations

import json

__all__ = [
    "ModelConfig",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
]


def _named(model_config: dict, kind: str, name: str) -> dict | None:
    return next((entry for entry in model_config.get(kind, []) if entry.get("name") == name), None)


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return _named(model_config, "input", name)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return _named(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")


class ModelConfig:
    """What ``auto_complete_config(auto_complete_model_config)`` receives and returns."""

    def __init__(self, model_config: dict | str) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        config.setdefault("name", "")
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._model_config = config

    @property
    def _name(self) -> str:
        return self._model_config["name"]

    def as_dict(self) -> dict:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for "
                f"model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config function "
                    f"for model '{self._name}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict) -> None:  # noqa: A002 - Triton's parameter name
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: dict) -> None:
        self._add("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{self._name}' "
                    "contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{self._name}', "
                    f"which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

    def _add(self, kind: str, spec: dict, allowed: tuple[str, ...]) -> None:
        where = f"in auto-complete-config function for model '{self._name}'"
        if "name" not in spec:
            raise ValueError(f"{kind} {where} is missing 'name' property.")
        name = spec["name"]
        extra = [key for key in spec if key not in allowed]
        if extra:
            listed = ", ".join(f"'{key}'" for key in allowed)
            raise ValueError(f"{kind} '{name}' {where} contains property other than {listed}.")
        for required in ("data_type", "dims"):
            if required not in spec:
                raise ValueError(f"{kind} '{name}' {where} is missing '{required}' property.")
        existing = _named(self._model_config, kind, name)
        if existing is None:
            self._model_config[kind].append(dict(spec))
            return
        declared = existing.get("data_type", "TYPE_INVALID")
        if declared != "TYPE_INVALID" and declared != spec["data_type"]:
            raise ValueError(
                f"unable to load model '{self._name}', configuration expects datatype {declared} for {kind} "
                f"'{name}', model provides {spec['data_type']}"
            )
        dims = [int(d) for d in existing.get("dims", [])]
        if dims and dims != [int(d) for d in spec["dims"]]:
            raise ValueError(
                f"model '{self._name}', tensor '{name}': the model expects dims {list(spec['dims'])} but the "
                f"model configuration specifies dims {dims}"
            )
        if "optional" in existing and "optional" in spec and existing["optional"] != spec["optional"]:
            raise ValueError(
                f"model '{self._name}', tensor '{name}': the model expects optional {spec['optional']} but the "
                f"model configuration specifies optional {existing['optional']}"
            )
        existing.update({key: value for key, value in spec.items() if key != "name"})

    def __repr__(self) -> str:
        return f"ModelConfig({self._model_config!r})"

