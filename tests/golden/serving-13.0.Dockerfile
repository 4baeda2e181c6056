# Triton 2.63.0 on CUDA 13.0 (tritonserver 25.11): Python 3.12, Ubuntu 24.04.
# Needs NVIDIA driver 580 or newer and a GPU of compute capability 7.5 or more.
# Rendered by triton-builder. Run: docker run --gpus=all -p 8000:8000 -p 8001:8001 -p 8002:8002 IMAGE

FROM nvcr.io/nvidia/tritonserver:25.11-py3
# Read by the NVIDIA container runtime: NGC's full images set them, -min and custom bases may not.
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility

# 1. Python environment(s) for the python backend: the largest, most stable layer.
COPY environment/ /

# 2. Model weights, into /models: a layer per model, largest first, so a
#    retrained model rebuilds and pushes its own layer (and those after it, unchanged: nothing to push).
COPY weights/encoder/ /
COPY weights/head/ /

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
