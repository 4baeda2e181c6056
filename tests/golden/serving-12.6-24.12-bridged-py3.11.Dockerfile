# Triton 2.53.0 on CUDA 12.6 (tritonserver 24.12): Python 3.12, Ubuntu 24.04.
# Needs NVIDIA driver 560 or newer and a GPU of compute capability 6.0 or more.
# Rendered by triton-builder. Run: docker run --gpus=all -p 8000:8000 -p 8001:8001 -p 8002:8002 IMAGE

# Python models: bridged: Python 3.11 on nvcr.io/nvidia/tritonserver:24.12-py3 (Triton 2.53.0, CUDA 12.6, Python 3.12, Ubuntu 24.04, driver >= 560); stub compiled from python_backend r24.12 for Python 3.11 (pybind11 2.12); interpreter Python 3.11 taken from python:3.11-slim-bookworm (glibc no newer than the release's 2.39)
# (their stub and environment are files of the model repository)

FROM nvcr.io/nvidia/tritonserver:24.12-py3
# Read by the NVIDIA container runtime: NGC's full images set them, -min and custom bases may not.
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility

# 1. Python environment(s) for the python backend: the largest, most stable layer.
COPY environment/ /

EXPOSE 8000 8001 8002 8003
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 CMD ["python3", "/opt/triton-builder/health.py", "--http-port=8000"]
ENV TRITON_BUILDER_DRAIN_S=5
USER 1000:1000
CMD ["python3", "/opt/triton-builder/supervisor.py", "--lock-admin-apis", "tritonserver", "--model-repository=/models", "--model-control-mode=explicit", "--load-model=*", "--backend-config=python,shm-default-byte-size=4194304", "--backend-config=python,shm-growth-byte-size=1048576"]

# 3. The health check (ready, and no dead python backend stub that is not healed) and the
#    supervisor that runs tritonserver and heals a dead stub: builder/runtime/{health,supervisor}.py,
#    into /opt/triton-builder.
COPY runtime/ /

# 4. Pipeline code and model configurations, into /models, and the bill of
#    materials (CycloneDX JSON, builder/image/sbom.py) at /opt/triton-builder/sbom.cdx.json: small, and the
#    only layer a code change rebuilds (a new version's SBOM changes with the code layer alone).
COPY code/ /
