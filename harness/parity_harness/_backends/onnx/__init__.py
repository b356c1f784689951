"""The ONNX family: graph helpers, the weights check, the decoder-with-past graph, and the ONNX backends."""
