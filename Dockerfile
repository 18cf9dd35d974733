# syntax=docker/dockerfile:1
# Build: a static binary (pure-Go SQLite, no cgo).
FROM golang:1.26-bookworm AS build
WORKDIR /src
# The SDK is a module of its own that go.mod replaces with ./sdk: its go.mod is
# needed to resolve the module graph.
COPY go.mod go.sum ./
COPY sdk/go.mod sdk/
RUN go mod download
COPY . .
# The JavaScript bot engine (runtime/jsengine's lockfile): npm ci, then embedded.
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm && rm -rf /var/lib/apt/lists/* \
 && make js
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/sandbot ./cmd/sandbot \
 && mkdir -p /out/data

# Run: nothing but the binary, as a non-root user.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sandbot /sandbot
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
ENV SANDBOT_ADDR=:8103 \
    SANDBOT_METRICS_ADDR=:9103 \
    SANDBOT_DATA_DIR=/data
EXPOSE 8103 9103
VOLUME ["/data"]
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["/sandbot", "healthcheck"]
ENTRYPOINT ["/sandbot"]
CMD ["serve"]
