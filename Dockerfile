# node-agent's container image: `cargo xtask image` (docker or podman).
#
# Build and run stages are both Debian 12 (bookworm), so the binary links
# against and runs on the same glibc, 2.36. The eBPF programs are built with
# the same offline recipe as on the development machines
# (../shared/notes/ebpf-toolchain.md): Debian's rustc-web 1.96 with its
# prebuilt core for bpfel-unknown-none, llvm-22, and bpf-linker 0.13.0; the
# host crates build with the same Debian cargo.
FROM debian:bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev git \
      rustc-web cargo-web libstd-rust-web-dev-bpf llvm-22-dev \
 && rm -rf /var/lib/apt/lists/*
RUN LLVM_PREFIX=/usr/lib/llvm-22 cargo install bpf-linker --version 0.13.0 --locked \
      --no-default-features --features llvm-22 --root /usr/local
WORKDIR /src
COPY . .
# With the committed PGO profile, as `cargo xtask run` builds it (see
# xtask/src/pgo.rs): rustc-web's LLVM is 22, the profile's.
RUN gzip -dc pgo/node-agent.profdata.gz > /tmp/node-agent.profdata \
 && RUSTFLAGS="-Cprofile-use=/tmp/node-agent.profdata -Cllvm-args=-no-pgo-warn-mismatch -Cllvm-args=-profile-summary-cold-count=0 -Clink-arg=-Wl,-z,keep-text-section-prefix -Clink-arg=-Wl,-z,pack-relative-relocs" \
    cargo build --release --locked -p node-agent \
 && install -D -m 0755 target/release/node-agent /out/node-agent

# distroless/cc: Debian 12's glibc 2.36 and libgcc, no shell, no package
# manager. The agent runs as uid 0 in its container (to read root-only
# tracefs) with only the capabilities the manifests grant; the controller
# runs as 65532 (its Deployment sets runAsUser).
FROM gcr.io/distroless/cc-debian12
COPY --from=build /out/node-agent /usr/bin/node-agent
EXPOSE 9100 9101
ENTRYPOINT ["/usr/bin/node-agent"]
