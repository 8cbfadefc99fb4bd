"""The leaves every layer may import: the error hierarchy (errors), tensor datatypes (tensors),
Triton's JSON rendering of a model config (config_json) and the check on files holding a secret
(private_files). They import nothing of the appliance but errors."""
