# Triton 2.51.0 on CUDA 12.6 (tritonserver 24.10): Python 3.10, Ubuntu 22.04.
# Needs NVIDIA driver 560 or newer and a GPU of compute capability 6.0 or more.
# Rendered by triton-builder. Run: docker run --gpus=all -p 8000:8000 -p 8001:8001 -p 8002:8002 IMAGE

FROM sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa

# 3. The health check (ready, and no dead python backend stub that is not healed) and the
#    supervisor that runs tritonserver and heals a dead stub: builder/runtime/{health,supervisor}.py,
#    into /opt/triton-builder.
COPY runtime/ /

# 4. Pipeline code and model configurations, into /models, and the bill of
#    materials (CycloneDX JSON, builder/image/sbom.py) at /opt/triton-builder/sbom.cdx.json: small, and the
#    only layer a code change rebuilds (a new version's SBOM changes with the code layer alone).
COPY code/ /
