# syntax=docker/dockerfile:1
#
# poolerd container image: a static binary on distroless (no shell, no libc,
# runs as uid 65532 "nonroot").
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t poolerd .
#   docker run --rm -p 6432:6432 -p 9930:9930 \
#     -e POOLERD_LISTEN=0.0.0.0:6432 \
#     -e POOLERD_HTTP_LISTEN=0.0.0.0:9930 \
#     -e POOLERD_UPSTREAM=postgres://app:secret@db.example.internal:5432/app \
#     poolerd
#
# Configuration: POOLERD_* environment variables, flags after the image name
# (docker run ... poolerd --pool-size 50), or a mounted file
# (-v ./poolerd.yaml:/etc/poolerd/poolerd.yaml:ro ... poolerd --config /etc/poolerd/poolerd.yaml).
#
# poolerd's default listen address is 127.0.0.1:6432, which inside a
# container only serves the same network namespace: right for a Kubernetes
# sidecar (the app container shares it), but a standalone container must set
# POOLERD_LISTEN=0.0.0.0:6432. The HTTP server's default, 127.0.0.1:9930, is
# the same: set POOLERD_HTTP_LISTEN=0.0.0.0:9930 (as above, and as
# deploy/kubernetes/sidecar.yaml and deploy/compose do) so that Prometheus
# and the kubelet's probes, which come in on the container's address, reach
# it. The image deliberately sets no POOLERD_* variables itself: environment
# variables win over the --config file, so a baked-in one would silently
# override a mounted configuration.
#
# Health: the image has no shell or curl, so it has no HEALTHCHECK. Probe
# poolerd's HTTP server (http_listen, 0.0.0.0:9930 as above) from outside:
# GET /readyz (200 only while poolerd accepts clients; use it for readiness
# and load balancers) and GET /healthz (liveness). See
# deploy/kubernetes/sidecar.yaml.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# Dependencies first, so that they stay cached while the code changes.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
# Only what the binary is built from (keeps bin/, .run/ and test data out of
# the build; .run/ may hold a PostgreSQL data directory the builder cannot
# even read).
COPY cmd/ cmd/
COPY internal/ internal/
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/poolerd ./cmd/poolerd

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/poolerd /poolerd
USER nonroot:nonroot
# 6432: PostgreSQL clients. 9930: /healthz, /readyz, /metrics (with
# POOLERD_HTTP_LISTEN=0.0.0.0:9930); 9931 is the usual http_probe_listen.
EXPOSE 6432 9930
# docker stop and Kubernetes send the image's stop signal: SIGINT is the safe
# shutdown bounded by shutdown_timeout. SIGTERM, as in PgBouncer 1.23+, waits
# for every client to disconnect (docs/operations.md, "Graceful shutdown").
STOPSIGNAL SIGINT
ENTRYPOINT ["/poolerd"]
