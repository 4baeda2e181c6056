"""The Triton server that runs without a GPU: Triton 2.51 unpacked from PyTriton's wheel, and a
host ``tritonserver`` process over a model repository."""
