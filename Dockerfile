# A volunteer's GPU peer: `swarm peer` in a CUDA PyTorch image (examples/docker_gpu/ shows how to run it).
#   docker build -t subspace-swarm .
#   docker run --gpus all -p 31337:31337 -v swarm-data:/data subspace-swarm --initial-peers /ip4/.../p2p/12D3KooW...
# The base image's torch must be the version setup.cfg pins (pip then keeps it): peers of one swarm must
# generate the same shared constants. Another CUDA build: --build-arg BASE_IMAGE=pytorch/pytorch:<tag>.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

# curl for the health check; the archive of the base image's Ubuntu release decides its version
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/subspace-swarm
COPY setup.cfg pyproject.toml README.md ./
COPY protocol ./protocol
COPY peer ./peer
COPY swarm ./swarm
# the package with the dependencies setup.cfg pins (torch and hivemind together)
RUN pip install --no-cache-dir . \
    && useradd --create-home --uid 1000 swarm \
    && mkdir -p /data \
    && chown swarm:swarm /data

# the user made above, by number (a host that has no user `swarm` can still resolve it)
USER 1000:1000
ENV PYTHONUNBUFFERED=1
# the peer's identity (its peer id, and so its stage) and its checkpoints live here: keep it across restarts
VOLUME /data
# libp2p: forward this port to the machine for direct connections; without it the peer is relayed
EXPOSE 31337/tcp
HEALTHCHECK --interval=30s --timeout=5s --start-period=5m --retries=3 \
    CMD ["sh", "-c", "curl -fsS http://127.0.0.1:8081/healthz || exit 1"]
# flags given to `docker run IMAGE ...` come after these and override them (e.g. --device cuda:1)
ENTRYPOINT ["swarm", "peer", "--host-maddrs", "/ip4/0.0.0.0/tcp/31337", "--identity", "/data/identity.key", "--checkpoint-dir", "/data/checkpoints", "--resume", "--health-port", "8081", "--device", "cuda"]
CMD ["--help"]
