# node-agent's container image.
#
# `cargo xtask image` builds it with Debian's podman and runc, pulling
# nothing: both bases are made from Debian 12's packages (xtask/src/image.rs)
# and passed as BUILD_BASE and RUNTIME_BASE; crates come from the host's
# cargo registry, mounted, with no network. Where a registry is reachable,
# `docker build .` (or `podman build .`) works with the defaults below.
#
# Build and run stages are both Debian 12 (bookworm), so the binary links
# against and runs on the same glibc, 2.36. The eBPF programs are built with
# the same offline recipe as on the development machines
# (../shared/notes/ebpf-toolchain.md): Debian's rustc-web 1.96 with its
# prebuilt core for bpfel-unknown-none, llvm-22, and bpf-linker 0.13.0; the
# host crates build with the same Debian cargo.
ARG BUILD_BASE=docker.io/library/debian:bookworm
ARG RUNTIME_BASE=gcr.io/distroless/cc-debian12

FROM ${BUILD_BASE} AS build
# The toolchain: already in `cargo xtask image`'s build base, installed here
# on a plain debian:bookworm.
RUN if ! command -v bpf-linker >/dev/null || ! dpkg -s rustc-web cargo-web libstd-rust-web-dev-bpf llvm-22-dev gcc libc6-dev >/dev/null 2>&1; then \
      apt-get update \
      && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev \
           rustc-web cargo-web libstd-rust-web-dev-bpf llvm-22-dev \
      && rm -rf /var/lib/apt/lists/* \
      && LLVM_PREFIX=/usr/lib/llvm-22 cargo install bpf-linker --version 0.13.0 --locked \
           --no-default-features --features llvm-22 --root /usr/local; \
    fi
WORKDIR /src
COPY . .
# No .git in the context (.dockerignore): the revision comes as an argument.
ARG NODE_AGENT_REVISION=unknown
# true with the mounted registry of `cargo xtask image`.
ARG CARGO_NET_OFFLINE=false
# With the committed PGO profile, as `cargo xtask run` builds it (see
# xtask/src/pgo.rs): the profile names functions by symbols whose hashes
# come from the toolchain's version and the crate's features, so it was
# trained with this toolchain (pgo/toolchain) on the agent's build; another
# toolchain builds the same code without the profile taking (a warning says
# so). Two builds of node-agent: the agent's, without the cluster commands
# (the `cluster` feature: controller, plan, explain, simulate, status,
# rollout, crd, manifests), and the controller's, with everything. Their
# products are copied out of target/, which `cargo xtask image` may mount.
RUN gzip -dc pgo/node-agent.profdata.gz > /tmp/node-agent.profdata \
 && if [ "$(rustc -V; cargo -V)" != "$(cat pgo/toolchain)" ]; then \
      echo "warning: pgo/toolchain is not this toolchain ($(rustc -V), $(cargo -V)): the PGO profile will not take" >&2; fi \
 && export RUSTFLAGS="-Cprofile-use=/tmp/node-agent.profdata -Cllvm-args=-no-pgo-warn-mismatch -Cllvm-args=-profile-summary-cold-count=0 -Clink-arg=-Wl,-z,keep-text-section-prefix -Clink-arg=-Wl,-z,pack-relative-relocs" \
    NODE_AGENT_REVISION="$NODE_AGENT_REVISION" CARGO_NET_OFFLINE="$CARGO_NET_OFFLINE" \
 && cargo build --release --locked -p node-agent --no-default-features \
 && install -D -m 0755 target/release/node-agent /out/agent/node-agent \
 && cargo build --release --locked -p node-agent \
 && install -D -m 0755 target/release/node-agent /out/controller/node-agent

# distroless/cc: Debian 12's glibc 2.36 and libgcc, CA certificates, no
# shell, no package manager.

# The controller's image (`--target controller`): the whole binary; the
# controller Deployment runs it as 65532 (its runAsUser).
FROM ${RUNTIME_BASE} AS controller
COPY --from=build /out/controller/node-agent /usr/bin/node-agent
EXPOSE 9101
ENTRYPOINT ["/usr/bin/node-agent"]

# The agent's image, the default stage: the agent runs as uid 0 in its
# container (to read root-only tracefs) with only the capabilities the
# manifests grant.
FROM ${RUNTIME_BASE} AS agent
COPY --from=build /out/agent/node-agent /usr/bin/node-agent
EXPOSE 9100
ENTRYPOINT ["/usr/bin/node-agent"]
