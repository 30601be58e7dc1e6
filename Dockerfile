# A volunteer's GPU peer: `swarm peer` in a CUDA PyTorch image (examples/docker_gpu/ shows how to run it).
#   docker build -t subspace-swarm .
#   docker run --gpus all -p 31337:31337 -v swarm-data:/data subspace-swarm --initial-peers /ip4/.../p2p/12D3KooW...
# The base image's torch must be the version setup.cfg pins (pip then keeps it): peers of one swarm must
# generate the same shared constants. Another CUDA build: --build-arg BASE_IMAGE=pytorch/pytorch:<tag>.
# Not pinned by digest yet: the tag has never been pulled here (no Docker). Once it has, pin it with
#   docker buildx imagetools inspect pytorch/pytorch:<tag>   (its "Digest: sha256:...")
# as BASE_IMAGE=pytorch/pytorch:<tag>@sha256:<digest>.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

# curl for the health check; the archive of the base image's Ubuntu release decides its version
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/subspace-swarm
# The dependencies first, in a layer that only a change of setup.cfg rebuilds: setup.cfg's pinned
# install_requires, torch and hivemind in one pip command (docs/design.md section 6), less LEAVE_OUT.
# A peer never imports matplotlib (`swarm bench` plots) nor tensorboard (`--tensorboard`), and
# `pip install -e .` must keep giving every documented subcommand, so setup.cfg keeps both and the image
# drops them here; `swarm bench` or `--tensorboard` in this image then says, in one sentence, what to
# pip install (swarm/optional.py).
ARG LEAVE_OUT="matplotlib tensorboard"
COPY setup.cfg ./
RUN python -c "import configparser, os, re; c = configparser.ConfigParser(interpolation=None); c.read('setup.cfg'); out = os.environ['LEAVE_OUT'].split(); reqs = [r.strip() for r in c['options']['install_requires'].splitlines() if r.strip()]; print('\n'.join(r for r in reqs if re.match(r'[A-Za-z0-9._-]+', r).group().lower() not in out))" > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
# then the source, and the package alone (its dependencies are all above, less LEAVE_OUT)
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY peer ./peer
COPY swarm ./swarm
RUN pip install --no-cache-dir --no-deps . \
    && useradd --create-home --uid 1000 swarm \
    && mkdir -p /data \
    && chown swarm:swarm /data

# the user made above, by number (a host that has no user `swarm` can still resolve it)
USER 1000:1000
ENV PYTHONUNBUFFERED=1
# /healthz is served on this port inside the container; the entrypoint and the health check both read
# it, so `docker run -e SWARM_HEALTH_PORT=9000 ...` moves both (a --health-port flag is refused)
ENV SWARM_HEALTH_PORT=8081
# the peer's identity (its peer id, and so its stage) and its checkpoints live here: keep it across restarts
VOLUME /data
# libp2p: forward this port to the machine for direct connections; without it the peer is relayed
EXPOSE 31337/tcp
HEALTHCHECK --interval=30s --timeout=5s --start-period=5m --retries=3 \
    CMD ["sh", "-c", "curl -fsS \"http://127.0.0.1:${SWARM_HEALTH_PORT}/healthz\" || exit 1"]
# flags given to `docker run IMAGE ...` come after these ("$@") and override them (e.g. --device cuda:1);
# exec: the peer itself gets SIGTERM from `docker stop`
ENTRYPOINT ["sh", "-c", "case \" $* \" in *' --health-port'*) echo 'error: this image serves /healthz on SWARM_HEALTH_PORT, which its health check follows too: drop --health-port and pass docker run -e SWARM_HEALTH_PORT=PORT instead.' >&2; exit 2;; esac; exec swarm peer --host-maddrs /ip4/0.0.0.0/tcp/31337 --identity /data/identity.key --checkpoint-dir /data/checkpoints --resume --health-port \"$SWARM_HEALTH_PORT\" --device cuda \"$@\"", "swarm-peer"]
CMD ["--help"]
