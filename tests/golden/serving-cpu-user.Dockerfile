# Triton 2.51.0 on the CPU base (the nvidia-pytriton wheel's server in the NGC layout): Python 3.11.
# Rendered by triton-builder. Run: docker run -p 8000:8000 -p 8001:8001 -p 8002:8002 IMAGE

FROM triton-builder/tritonserver-cpu:2.51.0-py3.11
RUN id -u triton >/dev/null 2>&1 || useradd --uid 1001 --no-create-home --shell /usr/sbin/nologin triton

# 1. Python environment(s) for the python backend: the largest, most stable layer.
COPY environment/ /

# 2. Model weights, into /models: a layer per model, largest first, so a
#    retrained model rebuilds and pushes its own layer (and those after it, unchanged: nothing to push).
COPY weights/encoder/ /
COPY weights/head/ /

EXPOSE 8000 8001 8002 8003
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 CMD ["python3", "/opt/triton-builder/health.py", "--http-port=9000"]
ENV TRITON_BUILDER_DRAIN_S=5
USER triton
CMD ["python3", "/opt/triton-builder/supervisor.py", "--lock-admin-apis", "tritonserver", "--model-repository=/models", "--model-control-mode=explicit", "--load-model=*", "--backend-config=python,shm-default-byte-size=4194304", "--backend-config=python,shm-growth-byte-size=1048576", "--log-verbose=1", "--http-port=9000"]

# 3. The health check (ready, and no dead python backend stub that is not healed) and the
#    supervisor that runs tritonserver and heals a dead stub: builder/runtime/{health,supervisor}.py,
#    into /opt/triton-builder.
COPY runtime/ /

# 4. Pipeline code and model configurations, into /models, and the bill of
#    materials (CycloneDX JSON, builder/image/sbom.py) at /opt/triton-builder/sbom.cdx.json: small, and the
#    only layer a code change rebuilds (a new version's SBOM changes with the code layer alone).
COPY code/ /
