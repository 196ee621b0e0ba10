# taproce image: static binaries on a minimal base.
#   podman build -t taproce .        (or docker build)
FROM docker.io/library/golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/taproce .

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/taproce /usr/local/bin/taproce
ENTRYPOINT ["/usr/local/bin/taproce"]
CMD ["--help"]
