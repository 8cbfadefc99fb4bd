"""The Python peers' side of bench.peers: each file runs inside its peer's own virtual environment (made by
``python -m bench.peers install``) and imports nothing of the appliance. Every one serves an ONNX model
with onnxruntime on one intra-op thread, as the appliance's default plan runs it, and answers the v2
(KServe / Open Inference) JSON body ``bench.peers`` sends."""
