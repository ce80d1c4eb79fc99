# syntax=docker/dockerfile:1
#
# The meshql container image: the release binary, built in a Rust image, on Debian slim, run as
# an unprivileged user. Build it from the repository root:
#
#   docker build -t meshql:dev .
#
# The image holds the binary (/usr/local/bin/meshql) and a copy of examples/ under
# /opt/meshql/examples; it serves examples/egg-economy unless told otherwise. Data goes to
# /var/lib/meshql (MESHQL_DATA_DIR, which every example's `data_dir` reads). Ports, probes and
# the topologies built on it: docs/DEPLOY.md.

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# ---- build ---------------------------------------------------------------------------------
FROM ${RUST_IMAGE} AS build
# cmake: the Kafka client (librdkafka) is compiled from its bundled source and linked
# statically; the rest (bundled SQLite, ring, mimalloc) needs only the C compiler the image has
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# .cargo/config.toml carries the bundled SQLite's compile-time flags
COPY .cargo .cargo
COPY Cargo.toml Cargo.lock ./
COPY crates crates
# The cache mounts keep downloaded crates and the build directory between builds (BuildKit), so
# the binary is copied out of the cached target directory in the same step. The release profile
# keeps line tables (about 195 MB); the image gets the binary without them (about 45 MB).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p meshql \
 && strip --strip-debug -o /usr/local/bin/meshql target/release/meshql

# ---- runtime -------------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime
# The binary needs glibc and libgcc_s only (TLS is rustls, SQLite and librdkafka are linked
# in); ca-certificates for TLS to databases, brokers and JWKS endpoints, curl for the compose
# files' health checks.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 meshql \
 && useradd --system --uid 10001 --gid meshql --no-create-home \
      --home-dir /var/lib/meshql --shell /usr/sbin/nologin meshql \
 && install -d -o meshql -g meshql -m 0750 /var/lib/meshql
COPY --from=build /usr/local/bin/meshql /usr/local/bin/meshql
COPY examples /opt/meshql/examples
ENV MESHQL_DATA_DIR=/var/lib/meshql
WORKDIR /var/lib/meshql
# numeric, so that Kubernetes' runAsNonRoot can verify it
USER 10001:10001
# egg-economy (the default), farm-cqrs write and read, events
EXPOSE 5088 3034 3035 4055
ENTRYPOINT ["meshql"]
CMD ["serve", "/opt/meshql/examples/egg-economy"]
