# The taproce image: the appliance (taproce), the CNI plugin (taproce-cni),
# taproce's libibverbs.so.1 (verbs/libibverbs, for pods' unmodified ibverbs
# programs) and the entrypoint that installs the plugin and the library
# onto the node and runs the appliance (taproce-entrypoint).
# images/README.md tells how the DaemonSet uses it.
#
#   podman build -t taproce:dev --build-arg VERSION="$(git describe --always --dirty)" .
#   docker build -t taproce:dev .
#
# Build arguments:
#   GO_IMAGE  the builder: an image with Go >= 1.26 and /bin/sh (default the
#             official golang image; see images/README.md for building with
#             a local one when Docker Hub cannot be reached)
#   C_IMAGE   the library's builder: Debian bookworm (default the
#             official debian image; scripts/image gives its local
#             debootstrapped builder). It installs gcc, make and
#             libibverbs-dev from Debian's archive when it lacks them.
#   VERSION   what `taproce --version` prints
#
# The binaries are static (CGO_ENABLED=0: no libc, no loader), so the
# runtime image is empty but for them and the library, which nothing in
# the image loads: no shell, no package manager, no other libraries.
# The library is built on bookworm, whose glibc (2.36) is the newest it
# can ask for; it needs glibc 2.34 or later in the pods that load it. The appliance configures the network over netlink itself and
# needs no iproute2. The DaemonSet runs it as root with all capabilities
# dropped but NET_ADMIN, SYS_ADMIN and SYS_PTRACE (images/README.md says
# why each is needed and why not a non-root user).
#
# images/image_test.go runs the `go build` commands and the library's
# build of this file as they are written here and checks that the
# binaries are static and the library is taproce's libibverbs.so.1.

ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm
ARG C_IMAGE=docker.io/library/debian:bookworm

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

# taproce's libibverbs.so.1, against Debian's libibverbs-dev headers
# (rdma-core 44's ABI and symbol versions). Only its sources are copied,
# so that a change elsewhere does not rebuild it.
FROM ${C_IMAGE} AS cbuild
# hadolint ignore=DL3008
RUN if ! { command -v cc && command -v make && test -e /usr/include/infiniband/verbs.h; } >/dev/null 2>&1; then \
        apt-get update && \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc make libc6-dev libibverbs-dev && \
        rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
COPY verbs/libibverbs/ verbs/libibverbs/
RUN make -C verbs/libibverbs && \
    install -D -m 0644 verbs/libibverbs/build/libibverbs.so.1 /out/libibverbs.so.1

FROM scratch
ARG VERSION=devel
LABEL org.opencontainers.image.title="taproce" \
      org.opencontainers.image.description="taproce: a user-space RoCEv2 NIC appliance and its CNI plugin" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/taproce/taproce"
COPY --from=build /out/taproce /out/taproce-cni /out/taproce-entrypoint /usr/local/bin/
# Where the entrypoint's -lib looks for it.
COPY --from=cbuild /out/libibverbs.so.1 /usr/lib/taproce/libibverbs.so.1
COPY config/taproce.toml /usr/share/taproce/taproce.toml.example
# Root, with capabilities limited by the DaemonSet: see images/README.md.
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["/usr/local/bin/taproce-entrypoint"]
