# syntax=docker/dockerfile:1
# inplace-updater images. Build from the repository root:
#   docker build -t inplace-updater:v0.1.0 .                              # server (default, last stage)
#   docker build --target node-agent -t inplace-updater-node:v0.1.0 .     # deploy/node DaemonSet image
#   docker build --target binary --output type=local,dest=dist .          # the node agent binary, for nodes
# Every architecture (amd64 and arm64; the images as one multi-platform manifest, the binaries in
# dist/linux_amd64/ and dist/linux_arm64/):
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/inplace-updater:v0.1.0 --push .
#   docker buildx build --platform linux/amd64,linux/arm64 --target binary --output type=local,dest=dist .
# Each platform is compiled natively for its own architecture (under QEMU emulation unless the builder has a
# node of that architecture: `docker buildx create --append` an arm64 node to build fast), so ring's C and
# assembly need no cross toolchain and the binaries are the same as on a machine of that architecture.
# The binaries are static (musl), so the very same files run in the distroless image and on any node
# distribution, whatever its glibc. Nodes get inplace-agent (the agent alone, no server code) stripped, its
# symbols and line tables split off into inplace-agent.debug: keep that file with the release for crash reports
# (docs/performance.md "Agent footprint": 71 MB as built, 11.1 MB stripped).

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
# Set by BuildKit for the platform being built (amd64, arm64); empty with the legacy builder (then uname -m).
ARG TARGETARCH
# musl-tools: the musl C toolchain for ring's C and assembly parts; protobuf-compiler and libprotobuf-dev: protoc for etcd-client and
# the well-known .proto files it imports (a Recommends of protobuf-compiler, so --no-install-recommends needs it named).
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools protobuf-compiler libprotobuf-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# scripts/build-release is the whole build (the musl target, static linkage, the stripped agent and its .debug
# file, the checks); `.ci/run` runs the same script without Docker, so CI builds and runs what this image ships.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    TARGETARCH="${TARGETARCH:-}" scripts/build-release /out

# The node agent binary, for `--output`: inplace-agent is what nodes download (deploy/node/install-agent.sh
# verifies it); inplace-agent.debug (its symbols and line tables, linked by .gnu_debuglink) stays with you for
# crash reports: `gdb inplace-agent core` or `addr2line -e inplace-agent.debug` find it. A multi-platform build
# writes one directory per platform (dist/linux_amd64/, dist/linux_arm64/).
FROM scratch AS binary
COPY --from=build /out/inplace-agent /inplace-agent
COPY --from=build /out/inplace-agent.debug /inplace-agent.debug

# The image of the privileged DaemonSet alternative (deploy/node): needs a shell and nsenter
# (util-linux) to start the agent in the host's namespaces, and runs as root by design.
FROM debian:bookworm-slim AS node-agent
COPY --from=build /out/inplace-agent /usr/local/bin/inplace-agent
ENTRYPOINT ["/usr/local/bin/inplace-agent"]
CMD ["--help"]

# The server (management cluster). Distroless: no shell, no package manager; runs as the image's
# nonroot user (65532), matching deploy/base's securityContext.
FROM gcr.io/distroless/static-debian12:nonroot AS server
COPY --from=build /out/inplace-updater /usr/local/bin/inplace-updater
# The agent of this release, beside the server: `serve` hands it to agents of its architecture
# (GET /agent/v1/binary) when they run another one (agent self-upgrade, docs/install.md).
COPY --from=build /out/inplace-agent /usr/local/bin/inplace-agent
USER 65532:65532
# 9443 hooks + agent API (TLS), 9440 health, 8080 metrics.
EXPOSE 9443 9440 8080
ENTRYPOINT ["/usr/local/bin/inplace-updater"]
CMD ["serve"]
