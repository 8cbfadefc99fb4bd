"""The leaves every layer may import: the error hierarchy (errors), tensor datatypes (tensors) and
Triton's JSON rendering of a model config (config_json). They import nothing of the appliance but errors."""
