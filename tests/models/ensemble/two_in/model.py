"""A Python step with two FP32 [8] inputs (a, b) and one output (y) that the ensemble validation tests put
into ensembles that must fail to load: it is loaded, never run."""


class TritonPythonModel:
    pass
