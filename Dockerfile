# tah: build a release binary, then copy it into a small Debian runtime image.
#
#   docker build -t tah .
#   docker run -p 8080:8080 -v tah-data:/data -e TAH_API_TOKENS=change-me-to-a-long-secret tah
#
# The image listens on 0.0.0.0, so tah refuses to start without API tokens (TAH_API_TOKENS) unless
# TAH_ALLOW_UNAUTHENTICATED=true says that something else guards the port (see docs/src/docker.md).

# ---- builder ---------------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src

# Build the dependencies alone first, against placeholder sources, so that this layer stays
# cached until Cargo.toml or Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && cargo build --release --locked \
    && rm -rf src

# Now the real sources. `migrations/` is embedded by sqlx::migrate! and `openapi.yaml` by
# include_str!, so both are needed at compile time. Touch the crate roots so that cargo
# rebuilds the crate itself and not the placeholder.
COPY src ./src
COPY migrations ./migrations
COPY openapi.yaml ./
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked \
    && cp target/release/tah /usr/local/bin/tah

# ---- runtime ---------------------------------------------------------------------------------
FROM debian:bookworm-slim

# No bubblewrap: a default `docker run` refuses the user namespaces it needs. `shell` runs under
# the Landlock backend instead (`--sandbox auto`), which is the tah binary itself and needs no
# package and no extra privilege: Docker's default seccomp profile allows the Landlock system
# calls. It needs a host kernel with Landlock (Linux 5.13+); /tmp holds each call's private
# temporary directory.

RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 tah \
    && useradd --system --uid 10001 --gid 10001 --home-dir /data --no-create-home \
        --shell /usr/sbin/nologin tah \
    && mkdir -p /data /workspace \
    && chown 10001:10001 /data /workspace

COPY --from=builder /usr/local/bin/tah /usr/local/bin/tah

# Listen on all interfaces inside the container, keep the database on the /data volume, and
# let the file tools read /workspace (mount a directory there to give the agent files).
ENV TAH_LISTEN=0.0.0.0:8080 \
    TAH_DATABASE_URL=sqlite:///data/tah.db \
    TAH_WORKSPACE=/workspace

USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8080

# `tah healthcheck` asks GET /readyz on TAH_LISTEN's port (over loopback) and exits 0 only on
# 200: the container turns unhealthy while the database refuses writes or the server stops.
# Orchestrators that probe over HTTP can use GET /healthz (liveness) and GET /readyz instead.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["tah", "healthcheck"]

# Provider TLS trusts the system's roots (ca-certificates). To trust a private CA, build on
# this image: USER root, COPY my-ca.crt /usr/local/share/ca-certificates/, RUN
# update-ca-certificates, USER 10001:10001 (or point SSL_CERT_FILE at a PEM bundle).
ENTRYPOINT ["tah"]
CMD ["serve"]
