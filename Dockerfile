# The taproce image: the appliance (taproce), the CNI plugin (taproce-cni),
# taproce's libibverbs.so.1 and librdmacm.so.1 (verbs/libibverbs and
# verbs/librdmacm, for pods' unmodified ibverbs and RDMA CM programs) and
# the entrypoint that installs the plugin and the libraries onto the node
# and runs the appliance (taproce-entrypoint).
# images/README.md tells how the DaemonSet uses it.
#
#   podman build -t taproce:dev --build-arg VERSION="$(git describe --always --dirty)" .
#   docker build -t taproce:dev .
#
# Build arguments:
#   GO_IMAGE  the builder: an image with Go >= 1.26 and /bin/sh (default the
#             official golang image; see images/README.md for building with
#             a local one when Docker Hub cannot be reached)
#   C_IMAGE   the libraries' builder: Debian bookworm (default the
#             official debian image; scripts/image gives its local
#             debootstrapped builder). It installs gcc, make,
#             libibverbs-dev and librdmacm-dev from Debian's archive when
#             it lacks them.
#   VERSION   what `taproce --version` prints
#
# The binaries are static (CGO_ENABLED=0: no libc, no loader), so the
# runtime image is empty but for them and the libraries, which nothing in
# the image loads: no shell, no package manager, no other libraries.
# The libraries are built on bookworm, whose glibc (2.36) is the newest
# they can ask for; they need glibc 2.34 or later in the pods that load
# them. The appliance configures the network over netlink itself and
# needs no iproute2. The DaemonSet runs it as root with all capabilities
# dropped but NET_ADMIN, SYS_ADMIN and SYS_PTRACE (images/README.md says
# why each is needed and why not a non-root user).
#
# images/image_test.go runs the `go build` commands and the libraries'
# build of this file as they are written here and checks that the
# binaries are static and the libraries are taproce's libibverbs.so.1
# and librdmacm.so.1 (images/library_test.go).

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

# taproce's libibverbs.so.1 and librdmacm.so.1, against Debian's
# libibverbs-dev and librdmacm-dev headers (rdma-core 44's ABI and symbol
# versions); librdmacm's make puts its library beside libibverbs.so.1 in
# verbs/libibverbs/build. Only their sources are copied, so that a change
# elsewhere does not rebuild them.
FROM ${C_IMAGE} AS cbuild
# hadolint ignore=DL3008
RUN if ! { command -v cc && command -v make && test -e /usr/include/infiniband/verbs.h && test -e /usr/include/rdma/rdma_cma.h; } >/dev/null 2>&1; then \
        apt-get update && \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc make libc6-dev libibverbs-dev librdmacm-dev && \
        rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
COPY verbs/libibverbs/ verbs/libibverbs/
COPY verbs/librdmacm/ verbs/librdmacm/
RUN make -C verbs/libibverbs && make -C verbs/librdmacm && \
    install -D -m 0644 verbs/libibverbs/build/libibverbs.so.1 /out/libibverbs.so.1 && \
    install -D -m 0644 verbs/libibverbs/build/librdmacm.so.1 /out/librdmacm.so.1

FROM scratch
ARG VERSION=devel
LABEL org.opencontainers.image.title="taproce" \
      org.opencontainers.image.description="taproce: a user-space RoCEv2 NIC appliance and its CNI plugin" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/taproce/taproce"
COPY --from=build /out/taproce /out/taproce-cni /out/taproce-entrypoint /usr/local/bin/
# Where the entrypoint's -lib looks for them.
COPY --from=cbuild /out/libibverbs.so.1 /out/librdmacm.so.1 /usr/lib/taproce/
COPY config/taproce.toml /usr/share/taproce/taproce.toml.example
# Root, with capabilities limited by the DaemonSet: see images/README.md.
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["/usr/local/bin/taproce-entrypoint"]
