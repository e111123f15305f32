# The allocator CLI and host agent. No CUDA inside: workers that need CUDA
# run in their own images; on a GPU host, run with the NVIDIA container runtime
# so NVML (libnvidia-ml) is available to the agent.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY allocator ./allocator
COPY config ./config
# serve: `allocator serve` (the status page) runs from the same image.
RUN pip install --no-cache-dir '.[etcd,consul,nvml,metrics,serve]'
ENTRYPOINT []
CMD ["allocator", "agent"]
