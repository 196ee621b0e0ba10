# The taproce image: the appliance (taproce), the CNI plugin (taproce-cni)
# and the entrypoint that installs the plugin onto the node and runs the
# appliance (taproce-entrypoint). images/README.md tells how the DaemonSet
# uses it.
#
#   podman build -t taproce:dev --build-arg VERSION="$(git describe --always --dirty)" .
#   docker build -t taproce:dev .
#
# Build arguments:
#   GO_IMAGE  the builder: an image with Go >= 1.26 and /bin/sh (default the
#             official golang image; see images/README.md for building with
#             a local one when Docker Hub cannot be reached)
#   VERSION   what `taproce --version` prints
#
# The binaries are static (CGO_ENABLED=0: no libc, no loader), so the
# runtime image is empty but for them: no shell, no package manager, no
# libraries. The appliance configures the network over netlink itself and
# needs no iproute2. The DaemonSet runs it as root with all capabilities
# dropped but NET_ADMIN, SYS_ADMIN and SYS_PTRACE (images/README.md says
# why each is needed and why not a non-root user).
#
# images/image_test.go runs the `go build` commands of this file as they
# are written here and checks that the binaries are static.

ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm

FROM ${GO_IMAGE} AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-mod=readonly
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION}" -o /out/taproce . && \
    CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o /out/taproce-cni ./cni/taproce-cni && \
    CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION}" -o /out/taproce-entrypoint ./images/entrypoint && \
    /out/taproce --version

FROM scratch
ARG VERSION=devel
LABEL org.opencontainers.image.title="taproce" \
      org.opencontainers.image.description="taproce: a user-space RoCEv2 NIC appliance and its CNI plugin" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/taproce/taproce"
COPY --from=build /out/taproce /out/taproce-cni /out/taproce-entrypoint /usr/local/bin/
COPY config/taproce.toml /usr/share/taproce/taproce.toml.example
# Root, with capabilities limited by the DaemonSet: see images/README.md.
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["/usr/local/bin/taproce-entrypoint"]
