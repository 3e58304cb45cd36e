# jobtrail's image: the three binaries (jobtrail, jobtrail-admin, jobtrail-sim) and the shipped
# contracts (in /usr/share/jobtrail/providers), on a distroless runtime (glibc and CA certificates, no shell, no package manager),
# running as an unprivileged user. Build: docker build -t jobtrail .
#
# The PostgreSQL server binaries are not in the image: `jobtrail demo`, `bench` and `dev-db` (which
# start a private cluster) are for a developer's machine; in a container every command takes
# DATABASE_URL.

FROM docker.io/library/rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so a source change does not refetch the registry.
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY migrations ./migrations
# The demo's contracts are compiled into the binary (crates/cli/src/fleet.rs).
COPY providers ./providers
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin jobtrail --bin jobtrail-admin --bin jobtrail-sim \
 && mkdir -p /out \
 && cp target/release/jobtrail target/release/jobtrail-admin target/release/jobtrail-sim /out/

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
# The shipped contracts (the simulator's, and examples) beside the binaries, not where a worker
# looks by default (/etc/jobtrail/providers, where the chart mounts yours): a worker of this image
# given no contracts is unready ("no provider contracts loaded"), not ready against the simulator.
# docker-compose.yml points JOBTRAIL_PROVIDERS here.
COPY providers /usr/share/jobtrail/providers
# distroless's "nonroot" user (65532); the chart also sets runAsNonRoot and a read-only root.
USER 65532:65532
ENV JOBTRAIL_LOG_FORMAT=json
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/jobtrail"]
CMD ["worker", "--ops-listen", "0.0.0.0:9090"]
